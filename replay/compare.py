"""Comparing two runs with a verdict per metric that separates change from noise.

Latency metrics compare per-request medians (TTFT, TPOT, E2E, and each request's median ITL: gaps
within one stream are not independent, so the request is the unit of resampling). The confidence
interval of the difference of medians comes from a seeded bootstrap. Rates (success rate, goodput)
use the normal approximation of the difference of two proportions.

A metric regresses when its change is both beyond the threshold and significant (the interval
excludes zero on the bad side); a large change inside the noise, or a small significant one, does
not fail the comparison.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from replay.metrics import Slo, counted, percentile, record_value, timed
from replay.record import RequestRecord
from replay.report import ms, records_of

LATENCY = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e", "E2E"))


def workload_mismatch(base: Mapping[str, Any], candidate: Mapping[str, Any]) -> str | None:
    """Why the two runs did not replay the same workload the same way, or None when they did.

    A result without a digest (written before it was recorded) cannot be checked, which is a
    mismatch too: the comparison would rest on trust.
    """
    digests = [doc.get("run", {}).get("workload") for doc in (base, candidate)]
    if not all(isinstance(d, dict) for d in digests):
        return "a result has no workload digest (written by an older version), so the workloads cannot be checked"
    if digests[0]["samples_sha256"] != digests[1]["samples_sha256"]:
        names = [doc.get("run", {}).get("samples") for doc in (base, candidate)]
        return f"the runs replayed different sample files ({names[0]} vs {names[1]}: contents differ)"
    if digests[0]["settings_sha256"] != digests[1]["settings_sha256"]:
        keys = ("plan", "overrides", "timeouts_s", "length_is_failure")
        differ = [k for k in keys if base["run"].get(k) != candidate["run"].get(k)]
        return f"the runs used different settings ({', '.join(differ) or 'run settings'} differ)"
    return None


@dataclass(frozen=True, slots=True)
class Verdict:
    metric: str
    kind: str  # "latency" (s, lower is better), "rate" (share, higher is better) or "info" (no test)
    base: float | None
    candidate: float | None
    change: float | None  # relative for latency, absolute for rates
    ci: tuple[float, float] | None  # of candidate - base
    verdict: str
    regression: bool


def resampled_median(ordered: Sequence[float], draw: random.Random) -> float:
    """The median of one bootstrap resample of a sorted sample, drawn in O(1).

    The k-th smallest of n uniform draws is Beta(k, n - k + 1) distributed, and flooring a uniform
    onto n slots keeps the order, so the median's position in `ordered` can be drawn directly
    instead of resampling and sorting n values; for even n the next order statistic follows from
    the first as u + (1 - u) * Beta(1, n - k).
    """
    n = len(ordered)
    k = (n + 1) // 2
    u = draw.betavariate(k, n - k + 1)
    low = ordered[min(int(u * n), n - 1)]
    if n % 2:
        return low
    v = u + (1 - u) * draw.betavariate(1, n - k)
    return (low + ordered[min(int(v * n), n - 1)]) / 2


def median_difference_ci(
    base: Sequence[float], candidate: Sequence[float], resamples: int, confidence: float, seed: int
) -> tuple[float, float]:
    """Bootstrap interval of median(candidate) - median(base)."""
    draw = random.Random(seed)
    a, b = sorted(base), sorted(candidate)
    diffs = sorted(resampled_median(b, draw) - resampled_median(a, draw) for _ in range(resamples))
    tail = (1 - confidence) / 2 * 100
    return percentile(diffs, tail), percentile(diffs, 100 - tail)


def proportion_difference_ci(base: Sequence[bool], candidate: Sequence[bool], confidence: float) -> tuple[float, float]:
    pa, pb = sum(base) / len(base), sum(candidate) / len(candidate)
    spread = (pa * (1 - pa) / len(base) + pb * (1 - pb) / len(candidate)) ** 0.5
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    return pb - pa - z * spread, pb - pa + z * spread


def _latency_verdict(
    name: str, base: Sequence[float], candidate: Sequence[float], threshold: float, options: Mapping[str, Any]
) -> Verdict:
    if not base or not candidate:
        return Verdict(name, "latency", None, None, None, None, "n/a (no successful requests)", False)
    mb, mc = percentile(sorted(base), 50), percentile(sorted(candidate), 50)
    change = (mc - mb) / mb if mb > 0 else None
    low, high = median_difference_ci(base, candidate, options["resamples"], options["confidence"], options["seed"])
    beyond = change is not None and abs(change) > threshold
    if low > 0 and beyond:
        verdict = "REGRESSION"
    elif high < 0 and beyond:
        verdict = "improvement"
    elif low > 0 or high < 0:
        verdict = f"changed, within {threshold:.0%}"
    else:
        verdict = "no significant change"
    return Verdict(name, "latency", mb, mc, change, (low, high), verdict, verdict == "REGRESSION")


def _rate_verdict(
    name: str, base: Sequence[bool], candidate: Sequence[bool], threshold: float, confidence: float
) -> Verdict:
    if not base or not candidate:
        return Verdict(name, "rate", None, None, None, None, "n/a (no requests)", False)
    pa, pb = sum(base) / len(base), sum(candidate) / len(candidate)
    low, high = proportion_difference_ci(base, candidate, confidence)
    change = pb - pa
    if high < 0 and -change > threshold:
        verdict = "REGRESSION"
    elif low > 0 and change > threshold:
        verdict = "improvement"
    elif low > 0 or high < 0:
        verdict = f"changed, within {threshold * 100:g} pts"
    else:
        verdict = "no significant change"
    return Verdict(name, "rate", pa, pb, change, (low, high), verdict, verdict == "REGRESSION")


def _latency_values(records: Sequence[RequestRecord], metric: str) -> list[float]:
    return [value for record in timed(records) if (value := record_value(record, metric)) is not None]


def compare_results(
    base: Mapping[str, Any],
    candidate: Mapping[str, Any],
    *,
    threshold: float = 0.1,
    rate_threshold: float = 0.01,
    resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> list[Verdict]:
    """One verdict per metric; goodput is judged under the base run's SLOs, applied to both."""
    a, b = counted(records_of(base)), counted(records_of(candidate))
    options = {"resamples": resamples, "confidence": confidence, "seed": seed}
    verdicts = [
        _latency_verdict(f"{title} p50", _latency_values(a, key), _latency_values(b, key), threshold, options)
        for key, title in LATENCY
    ]
    verdicts.append(_rate_verdict("success rate", [r.ok for r in a], [r.ok for r in b], rate_threshold, confidence))
    slos = [Slo(metric, float(limit)) for metric, limit in base["summary"].get("slos", {}).items()]
    if slos:
        good_a = [r.ok and all(s.met_by(r) for s in slos) for r in a]
        good_b = [r.ok and all(s.met_by(r) for s in slos) for r in b]
        verdicts.append(_rate_verdict("goodput", good_a, good_b, rate_threshold, confidence))
    for key, title in (("requests_per_s", "req/s"), ("output_tokens_per_s", "output tok/s")):
        verdicts.append(_info(title, base["summary"].get(key), candidate["summary"].get(key)))
    return verdicts


def _info(name: str, base: Any, candidate: Any) -> Verdict:
    """Throughput is one figure per run, so there is no spread to test it against: shown only."""
    mb = float(base) if isinstance(base, int | float) else None
    mc = float(candidate) if isinstance(candidate, int | float) else None
    change = (mc - mb) / mb if mb and mc is not None else None
    return Verdict(name, "info", mb, mc, change, None, "shown only (one figure per run)", False)


def _cells(verdict: Verdict) -> tuple[str, str, str, str]:
    if verdict.kind == "latency":
        change = "-" if verdict.change is None else f"{verdict.change:+.1%}"
        ci = "-" if verdict.ci is None else f"[{ms(verdict.ci[0], 2)}, {ms(verdict.ci[1], 2)}] ms"
        return ms(verdict.base, 2), ms(verdict.candidate, 2), change, ci
    change = "-" if verdict.change is None else f"{verdict.change * 100:+.2f} pts"
    ci = "-" if verdict.ci is None else f"[{verdict.ci[0] * 100:+.2f}, {verdict.ci[1] * 100:+.2f}] pts"
    if verdict.kind == "info":
        change = "-" if verdict.change is None else f"{verdict.change:+.1%}"
        return _number(verdict.base), _number(verdict.candidate), change, "-"
    return _share(verdict.base), _share(verdict.candidate), change, ci


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.2f}%"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def render_comparison(
    verdicts: Sequence[Verdict], base: Mapping[str, Any], candidate: Mapping[str, Any], names: tuple[str, str]
) -> str:
    lines = [f"base      {names[0]}  ({base['run'].get('shape', '')})"]
    lines.append(f"candidate {names[1]}  ({candidate['run'].get('shape', '')})")
    for role, doc in (("base", base), ("candidate", candidate)):
        if not doc.get("valid", False):
            lines.append(f"WARNING: the {role} run is marked invalid: {'; '.join(doc.get('problems', []))}")
    lines += [
        "latency: bootstrap CI of the median difference (requests resampled); rates: normal approximation",
        f"{'metric':<16}{'base':>12}{'candidate':>12}{'change':>12}  {'CI of the difference':<28}verdict",
    ]
    for verdict in verdicts:
        was, now, change, ci = _cells(verdict)
        unit = " (ms)" if verdict.kind == "latency" else ""
        lines.append(f"{verdict.metric + unit:<16}{was:>12}{now:>12}{change:>12}  {ci:<28}{verdict.verdict}")
    regressions = [v.metric for v in verdicts if v.regression]
    lines.append("verdict: " + (f"REGRESSION in {', '.join(regressions)}" if regressions else "no regression"))
    return "\n".join(lines)
