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
    assert check_gate(outcome, Thresholds()).reasons == ("score 75.0% < set threshold 100.0%",)
    assert check_gate(outcome, Thresholds(min_pass_rate=0.75)).passed


def test_errors_beyond_max_errors_fail_the_gate_even_when_pass_rate_is_met() -> None:
    outcome = result(case("a", True), case("b", False, error="HTTP 503"))
    verdict = check_gate(outcome, Thresholds(min_pass_rate=0.5))
    assert verdict.reasons == ("1 errored cases > 0 allowed",)
    assert check_gate(outcome, Thresholds(min_pass_rate=0.5, max_errors=1)).passed


def test_per_tag_threshold_fails_when_that_tag_falls_short() -> None:
    outcome = result(case("a", True, "tools"), case("b", False, "tools"), case("c", True, "format"))
    thresholds = Thresholds(min_pass_rate=0.5, tag_min_pass_rate={"tools": 1.0, "format": 1.0})
    assert check_gate(outcome, thresholds).reasons == ("tag 'tools': score 50.0% < 100.0% (2 cases)",)


def test_per_tag_threshold_on_an_absent_tag_fails_instead_of_passing_vacuously() -> None:
    verdict = check_gate(result(case("a", True)), Thresholds(tag_min_pass_rate={"safety": 0.9}))
    assert verdict.reasons == ("tag 'safety': no cases carry this tag",)


@pytest.mark.parametrize("kwargs", [{"min_pass_rate": 1.5}, {"max_errors": -1}, {"tag_min_pass_rate": {"t": -0.1}}])
def test_out_of_range_thresholds_are_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=r">= 0|\[0, 1\]"):
        Thresholds(**kwargs)  # type: ignore[arg-type]


def weighted(case_id: str, passed: bool, weight: float, *tags: str) -> CaseResult:
    return CaseResult(case_id=case_id, tags=tags, weight=weight, passed=passed, latency_s=0.1)


def test_score_is_the_weighted_share_of_passed_cases() -> None:
    outcome = result(weighted("a", True, 3), weighted("b", False, 1))
    assert (outcome.summary.pass_rate, outcome.summary.score) == (0.5, 0.75)


def test_gate_uses_the_set_threshold_unless_overridden() -> None:
    cases = (weighted("a", True, 3), weighted("b", False, 1))
    outcome = result(*cases).model_copy(update={"set_threshold": 0.7})
    assert check_gate(outcome, Thresholds()).passed
    assert check_gate(outcome.model_copy(update={"set_threshold": 0.8}), Thresholds()).reasons == (
        "score 75.0% < set threshold 80.0%",
    )
    assert check_gate(outcome, Thresholds(min_pass_rate=0.9)).reasons == ("score 75.0% < minimum 90.0%",)
    assert check_gate(outcome.model_copy(update={"set_threshold": 0.9}), Thresholds(min_pass_rate=0.5)).passed


def test_per_tag_score_is_weighted() -> None:
    outcome = result(weighted("a", True, 4, "t"), weighted("b", False, 1, "t"))
    assert check_gate(outcome, Thresholds(min_pass_rate=0, tag_min_pass_rate={"t": 0.8})).passed
    assert not check_gate(outcome, Thresholds(min_pass_rate=0, tag_min_pass_rate={"t": 0.81})).passed
