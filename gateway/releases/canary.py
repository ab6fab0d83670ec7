"""Canary judgement: compare the candidate's requests with the active release's, over a window.

Each replica judges the traffic it serves; the first replica to see a breach ends the canary for
all of them (the canary lives in the store). A breach is the candidate's error rate above
`max_error_rate`, or its median TTFT or TPOT above `max_latency_ratio` x the baseline's, once both
sides have `min_requests` requests in the window.

A canary with `steps` (shares, e.g. 0.05 -> 0.25 -> 1.0) moves up a step when a whole window has
passed at the current step without a breach and with `min_requests` candidate requests seen here;
the last step (a share of 1) promotes the candidate. Moves are compare-and-sets in the store, so of
all replicas exactly one makes each.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.store.release_record import CanarySettings


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

    def breach(self, model: str, canary: CanarySettings) -> str | None:
        """Why the canary must end, or None while it looks no worse than the baseline."""
        horizon = self._clock() - canary.window_s
        recent = [o for o in self._outcomes.get(model, ()) if o.at >= horizon]
        candidate = [o for o in recent if o.canary]
        baseline = [o for o in recent if not o.canary]
        minimum = canary.min_requests
        if len(candidate) < minimum:
            return None
        error_rate = sum(not o.ok for o in candidate) / len(candidate)
        if error_rate > canary.max_error_rate:
            return f"error rate {error_rate:.1%} over {len(candidate)} requests > {canary.max_error_rate:.1%}"
        if len(baseline) < minimum:
            return None
        for metric in ("ttft_s", "tpot_s"):
            ratio = _median_ratio(candidate, baseline, metric)
            if ratio is not None and ratio > canary.max_latency_ratio:
                return f"{metric[:-2].upper()} median {ratio:.2f}x the active release's"
        return None

    def stats(self, model: str, canary: CanarySettings) -> dict[str, Any]:
        """This replica's view of the window: requests, errors and medians per side."""
        horizon = self._clock() - canary.window_s
        recent = [o for o in self._outcomes.get(model, ()) if o.at >= horizon]
        return {
            "window_s": float(canary.window_s),
            "candidate": _side([o for o in recent if o.canary]),
            "baseline": _side([o for o in recent if not o.canary]),
        }

    def candidate_requests(self, model: str, since: float) -> int:
        return sum(1 for o in self._outcomes.get(model, ()) if o.canary and o.at >= since)


def _side(outcomes: list[Outcome]) -> dict[str, Any]:
    errors = sum(not o.ok for o in outcomes)
    ttft = [o.ttft_s for o in outcomes if o.ttft_s is not None]
    tpot = [o.tpot_s for o in outcomes if o.tpot_s is not None]
    return {
        "requests": len(outcomes),
        "errors": errors,
        "error_rate": errors / len(outcomes) if outcomes else None,
        "ttft_p50_s": statistics.median(ttft) if ttft else None,
        "tpot_p50_s": statistics.median(tpot) if tpot else None,
    }


def _median_ratio(candidate: list[Outcome], baseline: list[Outcome], metric: str) -> float | None:
    mine = [getattr(o, metric) for o in candidate if getattr(o, metric) is not None]
    theirs = [getattr(o, metric) for o in baseline if getattr(o, metric) is not None]
    if not mine or not theirs or statistics.median(theirs) <= 0:
        return None
    return float(statistics.median(mine) / statistics.median(theirs))
