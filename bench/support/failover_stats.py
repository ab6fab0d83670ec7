"""Recovery time of one drill, the summary per failure kind, and the Markdown tables.

Recovery = (arrival of the first token after the failure) - (time of the failure) - (the
fallback's configured TTFT). The TTFT is subtracted because it is the fallback's own latency, the
same with or without a gateway; what is left is what failing over costs: noticing the failure,
choosing the next deployment, building the continuation request, and relaying its first token.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.support.harness import cell, markdown, yes_no
from bench.support.sse_client import StreamRecord

STALL = "stall"
KILL = "kill"


@dataclass(frozen=True)
class Failure:
    """When the primary failed, and which arriving token is the first one of the fallback."""

    at: float  # perf_counter seconds
    first_index: int | None  # index into the record's tokens; None when none came after it
    late_primary_tokens: int  # tokens of the primary that arrived after the failure time (kill only)


def fault_failure(record: StreamRecord, k: int, offset_s: float) -> Failure | None:
    """A sim fault after k tokens: the failure is `offset_s` after token k arrived at the client.

    A cut, malformed chunk or in-band error fires when token k + 1 would have been sent, one TPOT
    after token k (an estimate: the client sees token k arrive, not the sim act). A stall is timed
    from token k itself, where the gateway's stall clock starts.
    """
    if len(record.token_times) < k:
        return None
    first = k if len(record.tokens) > k else None
    return Failure(record.token_times[k - 1] + offset_s, first, 0)


def kill_failure(record: StreamRecord, fallback_ttft_s: float) -> Failure | None:
    """The failure is the SIGKILL. Tokens arriving sooner than half the fallback's TTFT after it
    can only be the primary's (already sent when it died); the first later token is the fallback's."""
    if record.hook_time is None:
        return None
    after = [i for i, t in enumerate(record.token_times) if t >= record.hook_time]
    late = [i for i in after if record.token_times[i] < record.hook_time + fallback_ttft_s / 2]
    rest = [i for i in after if i not in late]
    return Failure(record.hook_time, rest[0] if rest else None, len(late))


@dataclass
class Drill:
    """One injected failure and what the client saw; written to the JSON as it is."""

    index: int
    kind: str
    k: int
    request_id: str
    failure_basis: str
    tokens: int
    expected_tokens: int
    text_matches: bool
    baseline_text_matches: bool
    errors: list[str]
    finish_reason: str | None
    gap_ms: float | None  # first token after the failure - failure time
    recovery_ms: float | None  # gap - fallback TTFT
    recovery_minus_stall_ms: float | None  # stalls only
    late_primary_tokens: int
    baseline_ttft_ms: float | None  # the same request uninterrupted: through the gateway, from the start
    baseline_request_id: str = ""
    attempts: list[dict[str, str | None]] | None = None  # from the audit log
    as_designed: bool | None = None  # the primary failed with output, the fallback finished
    baseline_attempts: list[dict[str, str | None]] | None = None  # should be the primary alone


@dataclass(frozen=True)
class Recovery:
    gap_ms: float | None = None  # first token after the failure - failure time
    recovery_ms: float | None = None  # gap - fallback TTFT
    minus_stall_ms: float | None = None  # stalls only: recovery - stall timeout


def recovery_figures(failure: Failure | None, record: StreamRecord, ttft_s: float, stall_s: float | None) -> Recovery:
    if failure is None or failure.first_index is None:
        return Recovery()
    gap = (record.token_times[failure.first_index] - failure.at) * 1000
    recovery = gap - ttft_s * 1000
    return Recovery(gap, recovery, recovery - stall_s * 1000 if stall_s is not None else None)


def check_routing(drill: Drill, audit: dict[str, dict[str, Any]]) -> None:
    """The audit record must show the primary failing after output and the fallback finishing."""
    baseline = audit.get(drill.baseline_request_id, {}).get("attempts")
    drill.baseline_attempts = baseline if isinstance(baseline, list) else None
    attempts = audit.get(drill.request_id, {}).get("attempts")
    if not isinstance(attempts, list):
        drill.as_designed = False
        return
    drill.attempts = attempts
    names = [a.get("deployment") for a in attempts]
    drill.as_designed = (
        names == ["primary", "fallback"] and attempts[0].get("error") is not None and attempts[1].get("error") is None
    )


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest rank: with 20 samples p99 is the largest, as it should be."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass(frozen=True)
class KindSummary:
    kind: str
    drills: int
    measured: int  # drills as designed with a token after the failure
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    raw_p50_ms: float | None  # stalls: before subtracting the stall timeout
    raw_p99_ms: float | None
    raw_max_ms: float | None
    text_mismatches: int
    baseline_mismatches: int
    not_as_designed: int
    with_errors: int
    late_primary_tokens: int
    ks: list[int]


def _figure(drill: Drill) -> float | None:
    return drill.recovery_minus_stall_ms if drill.kind == STALL else drill.recovery_ms


def summarize(kind: str, drills: Sequence[Drill]) -> KindSummary:
    good = [d for d in drills if d.as_designed]
    adjusted = [v for d in good if (v := _figure(d)) is not None]
    raw = [v for d in good if (v := d.recovery_ms) is not None]
    return KindSummary(
        kind=kind,
        drills=len(drills),
        measured=len(adjusted),
        p50_ms=percentile(adjusted, 0.5),
        p99_ms=percentile(adjusted, 0.99),
        max_ms=max(adjusted, default=None),
        raw_p50_ms=percentile(raw, 0.5),
        raw_p99_ms=percentile(raw, 0.99),
        raw_max_ms=max(raw, default=None),
        text_mismatches=sum(not d.text_matches for d in drills),
        baseline_mismatches=sum(not d.baseline_text_matches for d in drills),
        not_as_designed=sum(not d.as_designed for d in drills),
        with_errors=sum(bool(d.errors) for d in drills),
        late_primary_tokens=sum(d.late_primary_tokens for d in drills),
        ks=sorted({d.k for d in drills}),
    )


def _cell(value: float | None) -> str:
    return cell(value, 1, grouped=False)


def markdown_summary(summaries: Sequence[KindSummary], target_ms: float) -> str:
    head = (
        "| kind | k values | drills | measured | p50 ms | p99 ms | max ms | raw p50 / p99 / max ms "
        f"| p99 <= {target_ms:g} ms | text mismatches | not as designed | with errors |"
    )
    return markdown(head, [_summary_cells(s, target_ms) for s in summaries])


def _summary_cells(s: KindSummary, target_ms: float) -> list[str]:
    raw = f"{_cell(s.raw_p50_ms)} / {_cell(s.raw_p99_ms)} / {_cell(s.raw_max_ms)}" if s.kind in (STALL, "all") else "-"
    met = yes_no(None if s.p99_ms is None else s.p99_ms <= target_ms)
    ks = ",".join(str(k) for k in s.ks)
    cells = [s.kind, ks, str(s.drills), str(s.measured), _cell(s.p50_ms), _cell(s.p99_ms), _cell(s.max_ms)]
    cells += [raw, met, str(s.text_mismatches), str(s.not_as_designed), str(s.with_errors)]
    return cells
