"""The promotion gate: whether an eval result is good enough to promote a model release."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from eval.runner import EvalResult


@dataclass(frozen=True, slots=True)
class Thresholds:
    """A minimum weighted score over all cases, at most `max_errors` errored cases, per-tag minimum scores.

    `min_pass_rate` of None means the set's own threshold (`EvalResult.set_threshold`); a number
    overrides it, as `--min-pass-rate` does.
    """

    min_pass_rate: float | None = None
    max_errors: int = 0
    tag_min_pass_rate: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        rates = [*([] if self.min_pass_rate is None else [self.min_pass_rate]), *self.tag_min_pass_rate.values()]
        if any(not 0.0 <= rate <= 1.0 for rate in rates):
            raise ValueError("pass rates must lie in [0, 1]")
        if self.max_errors < 0:
            raise ValueError("max_errors must be >= 0")


@dataclass(frozen=True, slots=True)
class GateVerdict:
    passed: bool
    reasons: tuple[str, ...]


def _tag_reasons(result: EvalResult, thresholds: Thresholds) -> list[str]:
    reasons = []
    for tag, minimum in sorted(thresholds.tag_min_pass_rate.items()):
        tagged = [case for case in result.cases if tag in case.tags]
        if not tagged:
            # A threshold on nothing would pass vacuously; a renamed tag must not open the gate.
            reasons.append(f"tag {tag!r}: no cases carry this tag")
            continue
        rate = sum(case.weight for case in tagged if case.passed) / sum(case.weight for case in tagged)
        if rate < minimum:
            reasons.append(f"tag {tag!r}: score {rate:.1%} < {minimum:.1%} ({len(tagged)} cases)")
    return reasons


def check_gate(result: EvalResult, thresholds: Thresholds) -> GateVerdict:
    """Passed when every threshold holds; `reasons` lists each that does not."""
    summary = result.summary
    reasons = []
    if summary.cases == 0:
        reasons.append("no cases ran")
    minimum = result.set_threshold if thresholds.min_pass_rate is None else thresholds.min_pass_rate
    if summary.score < minimum:
        source = "set threshold" if thresholds.min_pass_rate is None else "minimum"
        reasons.append(f"score {summary.score:.1%} < {source} {minimum:.1%}")
    if summary.errors > thresholds.max_errors:
        reasons.append(f"{summary.errors} errored cases > {thresholds.max_errors} allowed")
    reasons.extend(_tag_reasons(result, thresholds))
    return GateVerdict(passed=not reasons, reasons=tuple(reasons))
