"""Comparing two eval results of the same set: which cases changed, and whether the score fell."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import orjson
from pydantic import ValidationError

from common.problems import key_path
from eval.runner import CaseResult, EvalResult

# Summed float weights may differ in the last bits; a drop smaller than this is no regression.
_SCORE_TOLERANCE = 1e-9


class ResultFileError(ValueError):
    """A result file that cannot be read or is not an eval result."""


class DigestMismatch(ValueError):
    """The two results ran different sets (or versions of one), so their scores do not compare."""

    def __init__(self, a: EvalResult, b: EvalResult) -> None:
        self.a_digest = a.set_digest
        self.b_digest = b.set_digest
        super().__init__(
            f"different eval sets: {a.set_id} v{a.set_version} ({a.set_digest[:12]}) "
            f"vs {b.set_id} v{b.set_version} ({b.set_digest[:12]})"
        )


@dataclass(frozen=True, slots=True)
class CaseComparison:
    case_id: str
    a: str  # PASS, FAIL, ERROR, or "-" when the result lacks the case
    b: str

    @property
    def changed(self) -> bool:
        return self.a != self.b


@dataclass(frozen=True, slots=True)
class Comparison:
    set_id: str
    set_version: str
    set_digest: str
    a_model: str
    b_model: str
    cases: tuple[CaseComparison, ...]
    a_score: float
    b_score: float

    @property
    def delta(self) -> float:
        return self.b_score - self.a_score

    @property
    def regressed(self) -> bool:
        """B scored lower than A."""
        return self.delta < -_SCORE_TOLERANCE


def status(case: CaseResult | None) -> str:
    if case is None:
        return "-"
    return "ERROR" if case.error else "PASS" if case.passed else "FAIL"


def compare_results(a: EvalResult, b: EvalResult) -> Comparison:
    """Side by side by case id, in A's order then B's extras; raises `DigestMismatch` across sets."""
    if a.set_digest != b.set_digest:
        raise DigestMismatch(a, b)
    a_cases = {case.case_id: case for case in a.cases}
    b_cases = {case.case_id: case for case in b.cases}
    ids = list(a_cases) + [case_id for case_id in b_cases if case_id not in a_cases]
    return Comparison(
        set_id=a.set_id,
        set_version=a.set_version,
        set_digest=a.set_digest,
        a_model=a.model,
        b_model=b.model,
        cases=tuple(CaseComparison(i, status(a_cases.get(i)), status(b_cases.get(i))) for i in ids),
        a_score=a.summary.score,
        b_score=b.summary.score,
    )


def load_result(path: Path | str) -> EvalResult:
    """Read the JSON `run --out` writes (`{"result": …, "gate": …}`) or a bare result object."""
    path = Path(path)
    try:
        document = orjson.loads(path.read_bytes())
    except OSError as error:
        raise ResultFileError(f"{path}: cannot read: {error.strerror or error}") from error
    except orjson.JSONDecodeError as error:
        raise ResultFileError(f"{path}: invalid JSON: {error}") from error
    if isinstance(document, dict) and "result" in document:
        document = document["result"]
    try:
        return EvalResult.model_validate(document)
    except ValidationError as error:
        first = error.errors()[0]
        where = key_path(first["loc"]) or "(top level)"
        raise ResultFileError(f"{path}: not an eval result: {where}: {first['msg']}") from error
