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
    (
        "TTFT",
        "Time to first token: from the moment just before the first byte of the request is handed to "
        "the transport (after any connect; connect and pool wait are in Setup) to the network read that "
        "delivers the first chunk carrying content, reasoning or a tool-call delta. The role-only first chunk "
        "does not count. For a non-streamed request, the arrival of the whole body (TTFT = E2E). The clock "
        "starts before the write, so the tool's own delays can only make TTFT read high, never below the "
        "server's receive-to-first-byte time; each request's client delay says by how much at most.",
    ),
    (
        "TPOT",
        "Time per output token after the first: (E2E - TTFT) / (output tokens - 1), one value per "
        "request. Streamed requests with at least two output tokens delivered in at least two chunks only: "
        "an answer that arrives in one chunk (a tool call sent whole) has no generation pace to measure and "
        "is counted under tpot_excluded. vLLM bench's TPOT; GuideLLM's ITL.",
    ),
    (
        "TPOT (token-weighted)",
        "The same per-request TPOT, each request weighted by its output tokens - 1: "
        "the pace of the average token rather than of the average request.",
    ),
    (
        "ITL",
        "Inter-token latency: every gap between consecutive output-carrying chunks of a stream, pooled "
        "over requests. Chunks delivered by the same network read are 0 apart. vLLM bench's ITL.",
    ),
    (
        "E2E",
        "End-to-end latency: from the same start as TTFT to the arrival of data: [DONE] (streams) or "
        "of the whole body.",
    ),
    (
        "Setup",
        "From dispatch to the start of the TTFT clock: connection-pool wait and TCP connect. "
        "Reported apart; not part of TTFT or E2E.",
    ),
    (
        "Output tokens",
        "usage.completion_tokens (stream_options.include_usage is always requested when "
        "streaming); without usage, the number of output-carrying chunks for a stream, or a count of words "
        "and punctuation marks (regex \\w+|[^\\w\\s]) for a body. Each record's tokens_source says which.",
    ),
    (
        "Success rate",
        "Succeeded / requests. Requests still running when the run's drain deadline passed "
        "are cancelled and not counted. finish_reason length the sample did not expect (no --max-tokens, "
        "no expect_finish_reason) is reported as 'length' and fails unless --length-ok; its latency is "
        "reported all the same. A sample with expect_tool_call: true fails as no_tool_call without one. "
        "A run exits 1 when the success rate is below --min-success-rate (default 0.5) or nothing succeeded.",
    ),
    (
        "Goodput",
        "Share of requests that succeeded and met every SLO. An SLO on a metric a request does not "
        "define (TPOT of a one-token reply) does not fail it. A request whose timing was excluded for client "
        "delay and that missed an SLO by no more than that delay is left out of the share (unjudged).",
    ),
    (
        "Throughput",
        "Requests/s: successful requests / wall time of the run (first dispatch to last "
        "completion). Output tokens/s: output tokens of successful requests / the same wall time.",
    ),
    (
        "Percentiles",
        "Over requests that produced output (succeeded, or cut off by length) and whose timing "
        "was not excluded, by linear interpolation between closest ranks (numpy's default).",
    ),
    (
        "Client delay",
        "Per request, the most the tool's own event loop could have added to its figures: the "
        "time from the start of its clock to the request written, and how late the loop was (a 1 ms ticker) "
        "at the read of its first output and at its last read. A request whose client delay exceeds "
        "max(--max-lag, 3% of its TTFT) is left out of the latency figures and counted. Dispatch lateness "
        "(how late a request left against its schedule) is reported apart: it changes the offered load, "
        "not latency.",
    ),
)


@dataclass(frozen=True, slots=True)
class Slo:
    """A per-request limit: `metric` (ttft, tpot or e2e) must be <= `limit_s`."""

    metric: str
    limit_s: float

    def met_by(self, record: RequestRecord, slack_s: float = 0.0) -> bool:
        """Whether the request meets the limit; with `slack_s`, whether it would have once that
        much is taken off its figure (the most the tool's own delay could have added)."""
        value = record_value(record, self.metric)
        return value is None or value - slack_s <= self.limit_s

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


def timed(records: Iterable[RequestRecord]) -> list[RequestRecord]:
    """The requests latency figures come from: they produced output and the tool's own delay
    did not distort their timing."""
    return [record for record in records if record.produced_output and record.timing_ok]


def metric_values(records: Iterable[RequestRecord], metric: str) -> list[float]:
    """Values pooled over timed requests; ITL contributes every gap, the others one per request."""
    measured = timed(records)
    if metric == "itl":
        return [gap for record in measured for gap in record.itl_s]
    return [value for record in measured if (value := record_value(record, metric)) is not None]


def weighted_distribution(pairs: Iterable[tuple[float, float]]) -> dict[str, float | int | None]:
    """Percentiles of values each carrying a weight: the smallest value whose cumulative weight
    reaches q% of the total (no interpolation, as weights make ranks uneven)."""
    ordered = sorted((value, weight) for value, weight in pairs if weight > 0)
    if not ordered:
        return {"n": 0, "mean": None, "max": None, **{f"p{q}": None for q in PERCENTILES}}
    total = sum(weight for _, weight in ordered)
    stats: dict[str, float | int | None] = {
        "n": len(ordered),
        "mean": sum(value * weight for value, weight in ordered) / total,
    }
    for q in PERCENTILES:
        target, running = total * q / 100, 0.0
        chosen = ordered[-1][0]
        for value, weight in ordered:
            running += weight
            if running >= target:
                chosen = value
                break
        stats[f"p{q}"] = chosen
    stats["max"] = ordered[-1][0]
    return stats


def tpot_token_weighted(records: Iterable[RequestRecord]) -> dict[str, float | int | None]:
    pairs = []
    for record in timed(records):
        tpot = record.tpot_s
        if tpot is not None and record.output_tokens is not None:
            pairs.append((tpot, float(record.output_tokens - 1)))
    return weighted_distribution(pairs)


def counted(records: Iterable[RequestRecord]) -> list[RequestRecord]:
    """The requests that count towards rates: cancelled ones are the tool's doing, not the server's."""
    return [record for record in records if record.reason != CANCELLED]


def summarize(records: Sequence[RequestRecord], wall_s: float, slos: Sequence[Slo]) -> dict[str, Any]:
    """Every figure of the summary, JSON-ready; latencies in seconds."""
    total = counted(records)
    ok = [record for record in total if record.ok]
    good = [record for record in ok if all(slo.met_by(record) for slo in slos)]
    # A miss the tool's own delay could explain (the request met every SLO once that delay is taken
    # off) is not judged either way; a miss beyond it is the endpoint's.
    unjudged = [
        r
        for r in ok
        if not r.timing_ok
        and not all(slo.met_by(r) for slo in slos)
        and all(slo.met_by(r, r.client_delay_s or 0.0) for slo in slos)
    ]
    tokens = sum(record.output_tokens or 0 for record in ok)
    produced = [record for record in total if record.produced_output]
    return {
        "requests": len(total),
        "cancelled": len(records) - len(total),
        "succeeded": len(ok),
        "failed": len(total) - len(ok),
        "length_cutoffs": sum(1 for record in total if record.finish_reason == "length"),
        "success_rate": _ratio(len(ok), len(total)),
        "goodput": _ratio(len(good), len(total) - len(unjudged)) if slos else None,
        "slos": {slo.metric: slo.limit_s for slo in slos},
        "met_slos": len(good) if slos else None,
        "unjudged_slos": len(unjudged) if slos else None,
        "wall_s": wall_s,
        "requests_per_s": _ratio(len(ok), wall_s),
        "output_tokens": tokens,
        "output_tokens_per_s": _ratio(tokens, wall_s),
        "tokens_source": dict(Counter(record.tokens_source or "none" for record in ok)),
        "latency": {metric: distribution(metric_values(produced, metric)) for metric in LATENCY_METRICS},
        "tpot_token_weighted": tpot_token_weighted(produced),
        "tpot_excluded": dict(Counter(reason for r in timed(produced) if (reason := r.tpot_excluded) is not None)),
        "timing": timing_summary(produced, records),
        "tool_calls": tool_call_summary(total),
        "failures": failure_table(records),
        "finish_reasons": dict(Counter(record.finish_reason or "none" for record in total)),
    }


def timing_summary(produced: Sequence[RequestRecord], records: Sequence[RequestRecord]) -> dict[str, Any]:
    """How much the tool's own delays touched the figures: the requests excluded and the spread."""
    delays = [r.client_delay_s for r in produced if r.client_delay_s is not None]
    late = [r.dispatch_late_s for r in records if r.dispatch_late_s is not None]
    excluded = [r for r in produced if not r.timing_ok]
    return {
        "measured": len(produced) - len(excluded),
        "excluded": len(excluded),
        "excluded_share": _ratio(len(excluded), len(produced)),
        "client_delay": distribution(delays),
        "dispatch_late": distribution(late),
    }


def tool_call_summary(records: Sequence[RequestRecord]) -> dict[str, int]:
    """What the samples' expect_tool_call asked for and what came back."""
    expected = [r for r in records if r.expect_tool_call is True]
    not_expected = [r for r in records if r.expect_tool_call is False]
    return {
        "expected": len(expected),
        "expected_and_got": sum(1 for r in expected if r.tool_call),
        "not_expected": len(not_expected),
        "not_expected_but_got": sum(1 for r in not_expected if r.tool_call),
        "with_tool_call": sum(1 for r in records if r.tool_call),
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
