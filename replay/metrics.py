"""What each reported figure means, and computing them from request records.

Tools disagree on these definitions (where TTFT starts, whether the role chunk counts, how TPOT
treats the first token), so the definitions live here as text next to the code that implements
them, and every report carries them.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from replay.record import CANCELLED, RequestRecord, reason_group, reason_label

PERCENTILES = (50, 90, 95, 99)
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2e", "setup")
SLO_METRICS = ("ttft", "tpot", "e2e")

DEFINITIONS: tuple[tuple[str, str], ...] = (
    ("TTFT", "Time to first token: from the moment the request body has been written to the socket to the "
     "arrival of the first chunk carrying content, reasoning or a tool-call delta. The role-only first "
     "chunk does not count. For a non-streamed request, the arrival of the whole body (TTFT = E2E)."),
    ("TPOT", "Time per output token after the first: (E2E - TTFT) / (output tokens - 1). Streamed requests "
     "with at least two output tokens only."),
    ("ITL", "Inter-token latency: every gap between consecutive output-carrying chunks of a stream, pooled "
     "over requests. Chunks delivered by the same network read are 0 apart."),
    ("E2E", "End-to-end latency: from the request written to the arrival of data: [DONE] (streams) or of "
     "the whole body."),
    ("Setup", "From dispatch to the request written: connection-pool wait, TCP connect and the write. "
     "Reported apart; not part of TTFT or E2E."),
    ("Output tokens", "usage.completion_tokens (stream_options.include_usage is always requested when "
     "streaming); without usage, the number of output-carrying chunks for a stream, or a count of words "
     "and punctuation marks (regex \\w+|[^\\w\\s]) for a body. Each record's tokens_source says which."),
    ("Success rate", "Succeeded / requests. Requests still running when the run's drain deadline passed "
     "are cancelled and not counted. finish_reason length the sample did not expect (no --max-tokens, "
     "no expect_finish_reason) is reported as 'length' and fails unless --length-ok."),
    ("Goodput", "Share of requests (same denominator) that succeeded and met every SLO. An SLO on a "
     "metric a request does not define (TPOT of a one-token reply) does not fail it."),
    ("Throughput", "Requests/s: successful requests / wall time of the run (first dispatch to last "
     "completion). Output tokens/s: output tokens of successful requests / the same wall time."),
    ("Percentiles", "Over successful requests only, by linear interpolation between closest ranks "
     "(numpy's default)."),
    ("Event-loop lag", "How late a ticker on the tool's own event loop wakes compared to when it asked "
     "to (every 5 ms). Every timestamp above is late by about this much. The report is invalid when "
     "the lag p99 exceeds min(--max-lag, 10% of TTFT p50), never below 2 ms (the ticker's resolution)."),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Slo:
    """A per-request limit: `metric` (ttft, tpot or e2e) must be <= `limit_s`."""

    metric: str
    limit_s: float

    def met_by(self, record: RequestRecord) -> bool:
        value = record_value(record, self.metric)
        return value is None or value <= self.limit_s

    def __str__(self) -> str:
        return f"{self.metric}<={self.limit_s * 1000:g}ms"


def percentile(ordered: Sequence[float], q: float) -> float:
    """The q-th percentile of an already sorted, non-empty sequence (linear interpolation)."""
    if not ordered:
        raise ValueError("percentile of an empty sequence")
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def distribution(values: Iterable[float]) -> dict[str, float | int | None]:
    ordered = sorted(values)
    if not ordered:
        return {"n": 0, "mean": None, "max": None, **{f"p{q}": None for q in PERCENTILES}}
    stats: dict[str, float | int | None] = {"n": len(ordered), "mean": sum(ordered) / len(ordered)}
    stats.update({f"p{q}": percentile(ordered, q) for q in PERCENTILES})
    stats["max"] = ordered[-1]
    return stats


def record_value(record: RequestRecord, metric: str) -> float | None:
    """A per-request figure: ttft, tpot, e2e, setup, or itl (that request's median gap)."""
    if metric == "itl":
        gaps = sorted(record.itl_s)
        return percentile(gaps, 50) if gaps else None
    return {"ttft": record.ttft_s, "tpot": record.tpot_s, "e2e": record.e2e_s, "setup": record.setup_s}[metric]


def metric_values(records: Iterable[RequestRecord], metric: str) -> list[float]:
    """Values pooled over successful requests; ITL contributes every gap, the others one per request."""
    ok = [record for record in records if record.ok]
    if metric == "itl":
        return [gap for record in ok for gap in record.itl_s]
    return [value for record in ok if (value := record_value(record, metric)) is not None]


def counted(records: Iterable[RequestRecord]) -> list[RequestRecord]:
    """The requests that count towards rates: cancelled ones are the tool's doing, not the server's."""
    return [record for record in records if record.reason != CANCELLED]


def summarize(records: Sequence[RequestRecord], wall_s: float, slos: Sequence[Slo]) -> dict[str, Any]:
    """Every figure of the summary, JSON-ready; latencies in seconds."""
    total = counted(records)
    ok = [record for record in total if record.ok]
    good = [record for record in ok if all(slo.met_by(record) for slo in slos)]
    tokens = sum(record.output_tokens or 0 for record in ok)
    return {
        "requests": len(total),
        "cancelled": len(records) - len(total),
        "succeeded": len(ok),
        "failed": len(total) - len(ok),
        "success_rate": _ratio(len(ok), len(total)),
        "goodput": _ratio(len(good), len(total)) if slos else None,
        "slos": {slo.metric: slo.limit_s for slo in slos},
        "met_slos": len(good) if slos else None,
        "wall_s": wall_s,
        "requests_per_s": _ratio(len(ok), wall_s),
        "output_tokens": tokens,
        "output_tokens_per_s": _ratio(tokens, wall_s),
        "tokens_source": dict(Counter(record.tokens_source or "none" for record in ok)),
        "latency": {metric: distribution(metric_values(ok, metric)) for metric in LATENCY_METRICS},
        "failures": failure_table(records),
        "finish_reasons": dict(Counter(record.finish_reason or "none" for record in total)),
    }


def _ratio(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 else None


def failure_table(records: Sequence[RequestRecord]) -> list[dict[str, Any]]:
    """One row per reason, most frequent first, with one example request each."""
    by_reason: dict[str, list[RequestRecord]] = {}
    for record in records:
        if record.reason is not None:
            by_reason.setdefault(record.reason, []).append(record)
    rows = []
    for reason, found in sorted(by_reason.items(), key=lambda item: (-len(item[1]), item[0])):
        example = found[0]
        rows.append(
            {
                "reason": reason,
                "group": reason_group(reason),
                "label": reason_label(reason),
                "count": len(found),
                "is_failure": reason != CANCELLED and not example.ok,
                "example": {"index": example.index, "sample_id": example.sample_id, "detail": example.detail},
            }
        )
    return rows
