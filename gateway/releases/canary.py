"""Canary judgement: compare the candidate's requests with the active release's, over a window.

Each replica judges the traffic it serves; the first replica to see a breach ends the canary for
all of them (the canary lives in the store). A breach is the candidate's error rate above
`max_error_rate`, or its median TTFT or TPOT above `max_latency_ratio` x the baseline's, once both
sides have `min_requests` requests in the window.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Outcome:
    at: float
    canary: bool
    ok: bool
    ttft_s: float | None
    tpot_s: float | None


class CanaryMonitor:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._outcomes: dict[str, deque[Outcome]] = {}

    def reset(self, model: str) -> None:
        self._outcomes.pop(model, None)

    def observe(self, model: str, outcome: Outcome) -> None:
        self._outcomes.setdefault(model, deque(maxlen=10_000)).append(outcome)

    def breach(self, model: str, canary: dict[str, Any]) -> str | None:
        """Why the canary must end, or None while it looks no worse than the baseline."""
        horizon = self._clock() - float(canary["window_s"])
        recent = [o for o in self._outcomes.get(model, ()) if o.at >= horizon]
        candidate = [o for o in recent if o.canary]
        baseline = [o for o in recent if not o.canary]
        minimum = int(canary.get("min_requests", 20))
        if len(candidate) < minimum:
            return None
        error_rate = sum(not o.ok for o in candidate) / len(candidate)
        if error_rate > float(canary["max_error_rate"]):
            return f"error rate {error_rate:.1%} over {len(candidate)} requests > {float(canary['max_error_rate']):.1%}"
        if len(baseline) < minimum:
            return None
        for metric in ("ttft_s", "tpot_s"):
            ratio = _median_ratio(candidate, baseline, metric)
            if ratio is not None and ratio > float(canary["max_latency_ratio"]):
                return f"{metric[:-2].upper()} median {ratio:.2f}x the active release's"
        return None


def _median_ratio(candidate: list[Outcome], baseline: list[Outcome], metric: str) -> float | None:
    mine = [getattr(o, metric) for o in candidate if getattr(o, metric) is not None]
    theirs = [getattr(o, metric) for o in baseline if getattr(o, metric) is not None]
    if not mine or not theirs or statistics.median(theirs) <= 0:
        return None
    return float(statistics.median(mine) / statistics.median(theirs))
