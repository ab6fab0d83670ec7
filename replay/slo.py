"""Parsing `--slo` and `--gate` and judging a summary against the gates.

An SLO is per request (`ttft=800ms`); goodput is the share of requests meeting all of them. A gate
is a condition on the run's summary (`success_rate>=0.99`, `goodput>=0.9`, `ttft_p99<=1s`); any
failing gate makes `replay run` exit non-zero.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from replay.metrics import LATENCY_METRICS, PERCENTILES, SLO_METRICS, Slo

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(us|ms|s|m)?\s*$")
_UNIT_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}
_GATE = re.compile(r"^\s*([a-z0-9_]+)\s*(>=|<=|>|<)\s*(\S+)\s*$")
_OPERATORS: Mapping[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
}
_RATES = ("success_rate", "goodput", "requests_per_s", "output_tokens_per_s")
_STATS = ("mean", "max", *(f"p{q}" for q in PERCENTILES))


class SpecError(ValueError):
    """An SLO or gate that cannot be parsed; the message shows the accepted forms."""


def parse_duration(text: str) -> float:
    """Seconds from `800ms`, `0.8s`, `250us`, `2m`; a bare number is milliseconds."""
    match = _DURATION.match(text)
    if not match:
        raise SpecError(f"{text!r} is not a duration (e.g. 800ms, 1.5s)")
    return float(match.group(1)) * _UNIT_S[match.group(2) or "ms"]


def parse_slo(text: str) -> Slo:
    metric, sep, limit = text.partition("=")
    metric = metric.strip().lower()
    if not sep or metric not in SLO_METRICS:
        raise SpecError(f"{text!r}: expected METRIC=DURATION with METRIC one of {', '.join(SLO_METRICS)}")
    return Slo(metric, parse_duration(limit))


@dataclass(frozen=True, slots=True)
class Gate:
    name: str
    op: str
    threshold: float
    text: str

    def judge(self, summary: Mapping[str, Any]) -> tuple[float | None, bool]:
        """The summary's value and whether the gate passes; a missing value fails it."""
        value = gate_value(summary, self.name)
        return value, value is not None and _OPERATORS[self.op](value, self.threshold)


def parse_gate(text: str) -> Gate:
    match = _GATE.match(text.lower())
    if not match:
        raise SpecError(f"{text!r}: expected NAME>=VALUE, e.g. success_rate>=0.99 or ttft_p99<=1s")
    name, op, raw = match.groups()
    if name in _RATES:
        try:
            threshold = float(raw)
        except ValueError:
            raise SpecError(f"{text!r}: {raw!r} is not a number") from None
    elif _latency_parts(name) is not None:
        threshold = parse_duration(raw)
    else:
        names = [*_RATES, *(f"{m}_{s}" for m in LATENCY_METRICS for s in ("p50", "p99"))]
        raise SpecError(f"{text!r}: unknown gate {name!r}; e.g. {', '.join(names)} (also p90, p95, mean, max)")
    return Gate(name, op, threshold, text.strip())


def _latency_parts(name: str) -> tuple[str, str] | None:
    metric, _, stat = name.rpartition("_")
    return (metric, stat) if metric in LATENCY_METRICS and stat in _STATS else None


def gate_value(summary: Mapping[str, Any], name: str) -> float | None:
    if name in _RATES:
        value = summary.get(name)
        return float(value) if isinstance(value, int | float) else None
    parts = _latency_parts(name)
    if parts is None:
        return None
    value = summary.get("latency", {}).get(parts[0], {}).get(parts[1])
    return float(value) if isinstance(value, int | float) else None


def judge_gates(gates: Sequence[Gate], summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    results = []
    for gate in gates:
        value, passed = gate.judge(summary)
        results.append({"gate": gate.text, "value": value, "passed": passed})
    return results
