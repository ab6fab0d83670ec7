"""`gateway replay run` end to end against the sim: outputs, gates and exit codes."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
from click.testing import CliRunner, Result

from gateway.cli.replay import replay_group
from replay.cli import EXIT_GATE_FAILED, EXIT_INVALID, _exit_code


def replay_run(url: str, samples: Path, *options: str) -> Result:
    arguments = ["run", str(samples), "--base-url", url, "--api-key", "sk-test", "--max-tokens", "8", "--quiet",
                 "--concurrency", "3", "--count", "6", "--allow-lag", *options]  # fmt: skip
    return CliRunner().invoke(replay_group, arguments)


def test_a_run_writes_the_summary_json_and_html(fast_sim: str, simple_samples: Path, tmp_path: Path) -> None:
    out, html = tmp_path / "result.json", tmp_path / "report.html"
    result = replay_run(fast_sim, simple_samples, "--out", str(out), "--html", str(html), "--slo", "ttft=5s")
    assert result.exit_code == 0, result.output
    assert "success rate 100.0%" in result.output
    assert re.search(r"TTFT\s+6\s", result.output)
    document = orjson.loads(out.read_bytes())
    assert document["schema"] == "gateway-replay/1"
    assert len(document["records"]) == 6
    assert all(len(r["event_times_s"]) >= len(r["output_times_s"]) == 8 for r in document["records"])
    assert set(document["definitions"]) >= {"TTFT", "TPOT", "ITL", "E2E", "Goodput"}
    assert "<svg" in html.read_text()


def test_a_failing_slo_gate_makes_the_run_exit_non_zero(fast_sim: str, simple_samples: Path) -> None:
    result = replay_run(fast_sim, simple_samples, "--slo", "ttft=1us", "--min-goodput", "0.9")
    assert result.exit_code == EXIT_GATE_FAILED, result.output
    assert "gate goodput>=0.9: 0 FAIL" in result.output


def test_a_success_rate_gate_fails_on_injected_errors(fast_sim: str, simple_samples: Path) -> None:
    result = replay_run(fast_sim, simple_samples, "--header", "X-Sim-Fault: status=503", "--gate", "success_rate>=0.99")
    assert result.exit_code == EXIT_GATE_FAILED, result.output
    assert re.search(r"http_503\s+5xx\s+6\s+yes", result.output)


def test_passing_gates_exit_zero(fast_sim: str, simple_samples: Path) -> None:
    result = replay_run(fast_sim, simple_samples, "--gate", "success_rate>=0.99", "--gate", "ttft_p99<=5s")
    assert result.exit_code == 0, result.output
    assert "gate ttft_p99<=5s" in result.output


def test_the_run_refuses_bad_options(simple_samples: Path) -> None:
    url = "http://127.0.0.1:9/v1"
    cases = [
        (["--header", "no-colon"], "Name: value"),
        (["--rate", "5", "--original-timing"], "pick one"),
        (["--min-goodput", "0.9"], "needs at least one --slo"),
        (["--slo", "latency=5ms"], "METRIC=DURATION"),
        (["--original-timing"], "timestamp"),
    ]
    for options, message in cases:
        result = replay_run(url, simple_samples, *options)
        assert result.exit_code == 2, (options, result.output)
        assert message in result.output, (options, result.output)


def test_an_invalid_measurement_exits_non_zero_unless_allowed() -> None:
    invalid = {"gates": [{"gate": "g", "value": 1.0, "passed": True}], "valid": False}
    assert _exit_code(invalid, allow_lag=False) == EXIT_INVALID
    assert _exit_code(invalid, allow_lag=True) == 0
    failed = {"gates": [{"gate": "g", "value": 0.0, "passed": False}], "valid": False}
    assert _exit_code(failed, allow_lag=True) == EXIT_GATE_FAILED
