"""The `evals` commands end to end against a real simulated backend on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

import orjson
import yaml
from click.testing import CliRunner

from eval.cli import EXIT_GATE_FAILED
from eval.sets import load_eval_set
from gateway.cli.evals import evals_group

EXAMPLE = Path(__file__).resolve().parents[2] / "eval" / "examples" / "smoke.yaml"


def run(*args: str) -> tuple[int, str]:
    outcome = CliRunner().invoke(evals_group, list(args))
    return outcome.exit_code, outcome.output


def failing_set(tmp_path: Path) -> Path:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["cases"][0]["assertions"].append({"contains": "zzz-never-said"})
    path = tmp_path / "failing.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_example_set_passes_against_the_sim_with_full_pass_rate(sim_url: str, tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    code, output = run("run", str(EXAMPLE), "--base-url", sim_url, "--model", "sim-model", "--out", str(out))
    assert code == 0, output
    assert "pass rate 100.0%" in output
    assert "gate: PASSED" in output
    document = orjson.loads(out.read_bytes())
    assert document["gate"] == {"passed": True, "reasons": [], "min_score": 1.0}
    assert document["result"]["summary"]["pass_rate"] == 1.0
    assert document["result"]["summary"]["score"] == 1.0
    assert document["result"]["set_id"] == "smoke"
    assert document["result"]["set_version"] == "1"
    assert document["result"]["set_digest"] == load_eval_set(EXAMPLE).digest


def test_failed_gate_exits_one_and_names_the_failed_assertion(sim_url: str, tmp_path: Path) -> None:
    code, output = run("run", str(failing_set(tmp_path)), "--base-url", sim_url, "--model", "sim-model")
    assert code == EXIT_GATE_FAILED
    assert "FAIL" in output
    assert "#3 contains: missing 'zzz-never-said'" in output
    assert "gate: FAILED" in output


def test_lower_min_pass_rate_lets_the_same_result_pass(sim_url: str, tmp_path: Path) -> None:
    path = str(failing_set(tmp_path))
    code, output = run("run", path, "--base-url", sim_url, "--model", "sim-model", "--min-pass-rate", "0.6")
    assert code == 0, output


def test_per_tag_threshold_from_the_command_line_fails_the_gate(sim_url: str, tmp_path: Path) -> None:
    path = str(failing_set(tmp_path))
    args = ["--min-pass-rate", "0.6", "--tag-min-pass-rate", "format=1.0"]
    code, output = run("run", path, "--base-url", sim_url, "--model", "sim-model", *args)
    assert code == EXIT_GATE_FAILED
    assert "tag 'format': score 50.0% < 100.0%" in output


def test_unreachable_endpoint_counts_as_errors_and_fails_the_gate(tmp_path: Path) -> None:
    # Port 9 (discard) on loopback has no listener here: the connection is refused at once.
    code, output = run("run", str(EXAMPLE), "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--timeout", "5")
    assert code == EXIT_GATE_FAILED
    assert "errors 3" in output


def test_invalid_set_exits_two_with_key_paths(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    case = {"id": "c", "messages": [{"role": "user", "content": "x"}], "assertions": [{"max_chars": -1}]}
    path.write_text(yaml.safe_dump({"id": "s", "version": 1, "cases": [case]}))
    code, output = run("show", str(path))
    assert code == 2
    assert "cases[0].assertions[0].max_chars.limit" in output


def test_malformed_tag_threshold_is_a_usage_error() -> None:
    code, output = run(
        "run", str(EXAMPLE), "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--tag-min-pass-rate", "x"
    )
    assert code == 2
    assert "expected TAG=RATE" in output


def test_show_prints_id_version_digest_and_case_count() -> None:
    code, output = run("show", str(EXAMPLE))
    assert code == 0
    digest = load_eval_set(EXAMPLE).digest
    assert output.splitlines() == ["id       smoke", "version  1", f"digest   sha256:{digest}", "cases    3"]


def test_set_threshold_is_the_gate_unless_the_command_line_overrides_it(sim_url: str, tmp_path: Path) -> None:
    path = failing_set(tmp_path)
    data = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**data, "threshold": 0.6}))
    code, output = run("run", str(path), "--base-url", sim_url, "--model", "sim-model")
    assert code == 0, output
    assert "set threshold 60.0%" in output
    code, output = run("run", str(path), "--base-url", sim_url, "--model", "sim-model", "--min-pass-rate", "0.9")
    assert code == EXIT_GATE_FAILED
    assert "score 66.7% < minimum 90.0%" in output
