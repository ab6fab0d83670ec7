from __future__ import annotations

import pytest

from eval.gate import Thresholds, check_gate
from eval.runner import CaseResult, EvalResult, summarize


def result(*cases: CaseResult) -> EvalResult:
    return EvalResult(set_id="s", set_version="1", set_digest="d", model="m", cases=cases, summary=summarize(cases))


def case(case_id: str, passed: bool, *tags: str, error: str | None = None) -> CaseResult:
    return CaseResult(case_id=case_id, tags=tags, passed=passed, latency_s=0.1, error=error)


def test_all_passing_result_passes_default_gate() -> None:
    verdict = check_gate(result(case("a", True), case("b", True)), Thresholds())
    assert (verdict.passed, verdict.reasons) == (True, ())


def test_one_failure_fails_default_gate_but_passes_a_lower_pass_rate() -> None:
    outcome = result(case("a", True), case("b", True), case("c", True), case("d", False))
    assert check_gate(outcome, Thresholds()).reasons == ("pass rate 75.0% < 100.0%",)
    assert check_gate(outcome, Thresholds(min_pass_rate=0.75)).passed


def test_errors_beyond_max_errors_fail_the_gate_even_when_pass_rate_is_met() -> None:
    outcome = result(case("a", True), case("b", False, error="HTTP 503"))
    verdict = check_gate(outcome, Thresholds(min_pass_rate=0.5))
    assert verdict.reasons == ("1 errored cases > 0 allowed",)
    assert check_gate(outcome, Thresholds(min_pass_rate=0.5, max_errors=1)).passed


def test_per_tag_threshold_fails_when_that_tag_falls_short() -> None:
    outcome = result(case("a", True, "tools"), case("b", False, "tools"), case("c", True, "format"))
    thresholds = Thresholds(min_pass_rate=0.5, tag_min_pass_rate={"tools": 1.0, "format": 1.0})
    assert check_gate(outcome, thresholds).reasons == ("tag 'tools': pass rate 50.0% < 100.0% (2 cases)",)


def test_per_tag_threshold_on_an_absent_tag_fails_instead_of_passing_vacuously() -> None:
    verdict = check_gate(result(case("a", True)), Thresholds(tag_min_pass_rate={"safety": 0.9}))
    assert verdict.reasons == ("tag 'safety': no cases carry this tag",)


@pytest.mark.parametrize("kwargs", [{"min_pass_rate": 1.5}, {"max_errors": -1}, {"tag_min_pass_rate": {"t": -0.1}}])
def test_out_of_range_thresholds_are_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=r">= 0|\[0, 1\]"):
        Thresholds(**kwargs)  # type: ignore[arg-type]
