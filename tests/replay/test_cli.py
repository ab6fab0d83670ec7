"""`gateway replay run` end to end against the sim: outputs, gates and exit codes."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
from click.testing import CliRunner, Result

from gateway.cli.replay import replay_group
from replay.cli import EXIT_GATE_FAILED, EXIT_INVALID, _exit_code
from tests.replay.conftest import chat_body, write_jsonl

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


# These tests are about what is reported, not about timing: a client delay limit no loaded machine
# reaches keeps every request in the latency figures (the limit itself is tested in test_metrics).
NO_DELAY_LIMIT = ("--max-lag", "60000")


def replay_run(url: str, samples: Path, *options: str) -> Result:
    arguments = ["run", str(samples), "--base-url", url, "--api-key", "sk-test", "--max-tokens", "8", "--quiet",
                 "--concurrency", "3", "--count", "6", *NO_DELAY_LIMIT, *options]  # fmt: skip
    return CliRunner().invoke(replay_group, arguments)


def test_a_run_writes_the_summary_json_and_html(fast_sim: str, simple_samples: Path, tmp_path: Path) -> None:
    out, html = tmp_path / "result.json", tmp_path / "report.html"
    result = replay_run(fast_sim, simple_samples, "--out", str(out), "--html", str(html), "--slo", "ttft=5s")
    assert result.exit_code == 0, result.output
    assert "success rate 100.0%" in result.output
    assert re.search(r"TTFT\s+6\s", result.output)
    document = orjson.loads(out.read_bytes())
    assert document["schema"] == "gateway-replay/2"
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


def test_a_run_where_every_request_fails_exits_non_zero_without_any_gate(fast_sim: str, simple_samples: Path) -> None:
    result = replay_run(fast_sim, simple_samples, "--header", "X-Sim-Fault: status=503")
    assert result.exit_code == EXIT_GATE_FAILED, result.output
    assert "gate success_rate>=0.5 (floor, --min-success-rate): 0 FAIL" in result.output


def test_the_success_rate_floor_can_be_set(fast_sim: str, simple_samples: Path) -> None:
    result = replay_run(fast_sim, simple_samples, "--header", "X-Sim-Fault: status=503,error_rate=0.5",
                        "--min-success-rate", "0.01")  # fmt: skip
    summary_line = next(line for line in result.output.splitlines() if line.startswith("requests "))
    succeeded = int(summary_line.split("succeeded ")[1].split()[0])
    assert result.exit_code == (0 if succeeded else EXIT_GATE_FAILED), result.output


def test_length_cut_offs_keep_their_latency_and_the_report_says_what_to_do(fast_sim: str, tmp_path: Path) -> None:
    samples = write_jsonl(tmp_path / "capped.jsonl", [chat_body(n, stream=True, max_tokens=4) for n in range(4)])
    arguments = ["run", str(samples), "--base-url", fast_sim, "--quiet", "--count", "4", *NO_DELAY_LIMIT]
    result = CliRunner().invoke(replay_group, arguments)
    assert result.exit_code == EXIT_GATE_FAILED, result.output
    assert "length cut-offs 4" in result.output
    assert re.search(r"TTFT\s+4\s", result.output), "every stream that produced tokens has its latency"
    assert "hint: 4 of 4 requests stopped at their max_tokens" in result.output
    assert "--max-tokens N" in result.output
    assert "--length-ok" in result.output
    tolerated = CliRunner().invoke(replay_group, [*arguments, "--length-ok"])
    assert tolerated.exit_code == 0, tolerated.output


def test_the_per_request_view_shows_each_request(fast_sim: str, simple_samples: Path) -> None:
    result = replay_run(fast_sim, simple_samples, "--per-request")
    assert result.exit_code == 0, result.output
    header = next(line for line in result.output.splitlines() if line.startswith("#"))
    assert header.split()[:5] == ["#", "sample", "status", "result", "finish"]
    rows = [line for line in result.output.splitlines() if re.match(r"^\d+\s+s\d+\s+200\s+ok\s+length", line)]
    assert len(rows) == 6


def test_expect_tool_call_is_honoured_and_counted(fast_sim: str, tmp_path: Path) -> None:
    items = [
        {"id": "asks", "expect_tool_call": True, **chat_body(1, stream=True, tools=[WEATHER_TOOL])},
        {"id": "no-tools", "expect_tool_call": True, **chat_body(2, stream=True)},
        {"id": "chat", "expect_tool_call": False, **chat_body(3, stream=True)},
    ]
    samples = write_jsonl(tmp_path / "tools.jsonl", items)
    out = tmp_path / "result.json"
    result = CliRunner().invoke(replay_group, ["run", str(samples), "--base-url", fast_sim, "--quiet", *NO_DELAY_LIMIT,
                                               "--per-request", "--out", str(out)])  # fmt: skip
    assert "tool calls: 1 of 2 requests that expected one got one; 0 of 1 that expected none made one" in result.output
    records = {r["sample_id"]: r for r in orjson.loads(out.read_bytes())["records"]}
    assert records["asks"]["ok"]
    assert records["asks"]["tool_call"]
    assert records["no-tools"]["reason"] == "no_tool_call"
    assert records["chat"]["ok"]
    # The sim sends the call's arguments in fragments; a call sent whole would be one chunk.
    assert records["asks"]["tpot_excluded"] is None


def test_a_placeholder_model_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    samples = write_jsonl(tmp_path / "placeholder.jsonl", [{**chat_body(1), "model": "default"}])
    result = CliRunner().invoke(replay_group, ["run", str(samples), "--base-url", "http://127.0.0.1:9/v1", "--quiet"])
    assert result.exit_code == 2, result.output
    assert "placeholder model 'default'" in result.output
    assert "--model NAME" in result.output


def test_the_first_404_with_nothing_succeeded_stops_the_run(fast_sim: str, tmp_path: Path) -> None:
    samples = write_jsonl(tmp_path / "many.jsonl", [chat_body(n, stream=True) for n in range(50)])
    result = CliRunner().invoke(replay_group, ["run", str(samples), "--base-url", fast_sim, "--quiet", *NO_DELAY_LIMIT,
                                               "--header", "X-Sim-Fault: status=404"])  # fmt: skip
    assert result.exit_code == EXIT_GATE_FAILED, result.output
    assert "STOPPED EARLY: the first answer was HTTP 404" in result.output
    assert "--model" in result.output
    requests = int(next(ln for ln in result.output.splitlines() if ln.startswith("requests ")).split()[1])
    assert requests < 50
