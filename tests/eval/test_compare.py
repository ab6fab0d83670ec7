"""`compare_results` and the `compare` command on result files like those `run --out` writes."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from eval.cli import EXIT_REGRESSED, compare_command
from eval.compare import CaseComparison, DigestMismatch, compare_results, load_result
from eval.runner import CaseResult, EvalResult, summarize


def case(case_id: str, passed: bool, weight: float = 1.0, error: str | None = None) -> CaseResult:
    return CaseResult(case_id=case_id, weight=weight, passed=passed, latency_s=0.1, error=error)


def result(*cases: CaseResult, digest: str = "d" * 64, model: str = "m") -> EvalResult:
    return EvalResult(
        set_id="s", set_version="1", set_digest=digest, model=model, cases=cases, summary=summarize(cases)
    )


def write(tmp_path: Path, name: str, outcome: EvalResult, wrapped: bool = True) -> str:
    path = tmp_path / name
    body = outcome.model_dump(mode="json")
    document = {"result": body, "gate": {"passed": True, "reasons": []}} if wrapped else body
    path.write_bytes(orjson.dumps(document))
    return str(path)


def run(*args: str) -> tuple[int, str]:
    outcome = CliRunner().invoke(compare_command, list(args))
    return outcome.exit_code, outcome.output


def test_comparison_lists_cases_side_by_side_with_the_score_delta() -> None:
    a = result(case("x", True, 3), case("y", True), case("z", False))
    b = result(case("x", True, 3), case("y", False, error="HTTP 503"), case("z", True), model="m2")
    comparison = compare_results(a, b)
    assert comparison.cases == (
        CaseComparison("x", "PASS", "PASS"),
        CaseComparison("y", "PASS", "ERROR"),
        CaseComparison("z", "FAIL", "PASS"),
    )
    assert [row.changed for row in comparison.cases] == [False, True, True]
    assert (comparison.a_score, comparison.b_score, comparison.delta) == (0.8, 0.8, 0.0)
    assert not comparison.regressed


def test_lower_weighted_score_in_b_is_a_regression() -> None:
    a = result(case("x", True, 3), case("y", False))
    b = result(case("x", False, 3), case("y", True))
    comparison = compare_results(a, b)
    assert comparison.delta == pytest.approx(-0.5)
    assert comparison.regressed
    assert not compare_results(b, a).regressed


def test_cases_missing_from_one_side_show_a_dash() -> None:
    comparison = compare_results(result(case("x", True)), result(case("x", True), case("new", False)))
    assert comparison.cases[1] == CaseComparison("new", "-", "FAIL")


def test_different_digests_are_refused() -> None:
    with pytest.raises(DigestMismatch, match="different eval sets"):
        compare_results(result(case("x", True)), result(case("x", True), digest="e" * 64))


def test_result_files_written_before_scores_existed_still_load(tmp_path: Path) -> None:
    body = result(case("x", True), case("y", False)).model_dump(mode="json")
    del body["summary"]["score"], body["set_threshold"]
    for row in body["cases"]:
        del row["weight"]
    path = tmp_path / "old.json"
    path.write_bytes(orjson.dumps({"result": body}))
    loaded = load_result(path)
    assert (loaded.summary.score, loaded.set_threshold, loaded.cases[0].weight) == (0.5, 1.0, 1.0)


def test_compare_command_exits_zero_without_regression(tmp_path: Path) -> None:
    a = write(tmp_path, "a.json", result(case("x", True), case("y", False), model="old"))
    b = write(tmp_path, "b.json", result(case("x", True), case("y", True), model="new"), wrapped=False)
    code, output = run(a, b)
    assert code == 0, output
    assert "y                            FAIL   PASS    changed" in output
    assert "score A 50.0% (old)  B 100.0% (new)  delta +50.0 pts" in output
    assert "no regression" in output


def test_compare_command_exits_one_on_regression(tmp_path: Path) -> None:
    a = write(tmp_path, "a.json", result(case("x", True), case("y", True)))
    b = write(tmp_path, "b.json", result(case("x", True), case("y", False)))
    code, output = run(a, b)
    assert code == EXIT_REGRESSED
    assert "delta -50.0 pts" in output
    assert "REGRESSION: B scores lower than A" in output


def test_compare_command_refuses_different_sets_with_exit_two(tmp_path: Path) -> None:
    a = write(tmp_path, "a.json", result(case("x", True)))
    b = write(tmp_path, "b.json", result(case("x", True), digest="e" * 64))
    code, output = run(a, b)
    assert code == 2
    assert "refusing to compare: different eval sets" in output


def test_compare_command_rejects_a_file_that_is_not_a_result(tmp_path: Path) -> None:
    a = write(tmp_path, "a.json", result(case("x", True)))
    bad = tmp_path / "bad.json"
    bad.write_text('{"result": {"set_id": "s"}}')
    code, output = run(a, str(bad))
    assert code == 2
    assert "not an eval result" in output
