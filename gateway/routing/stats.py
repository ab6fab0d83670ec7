"""Latency statistics per deployment and passive detection of slow-but-alive deployments.

A deployment that answers, but slowly, passes every health probe and never trips a breaker; it
only drags the tail. So each deployment keeps an EWMA of TTFT and TPOT, and one whose EWMA
exceeds `factor` x the median of its peers' or `factor` x its own baseline (a much slower EWMA
of the same samples) is marked degraded for `cooldown_s`. Degraded
deployments go to the back of every routing order; when the cooldown ends the statistics are
reset, so the deployment is measured afresh instead of being judged on stale numbers forever.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gateway.settings import SlowDetectionSettings


@dataclass(slots=True)
class Ewma:
    alpha: float
    value: float | None = None
    samples: int = 0

    def add(self, sample: float) -> None:
        self.value = sample if self.value is None else self.value + self.alpha * (sample - self.value)
        self.samples += 1

    def reset(self) -> None:
        self.value = None
        self.samples = 0


class LatencyStats:
    def __init__(self, alpha: float, clock: Callable[[], float] = time.monotonic, baseline_alpha: float = 0.02) -> None:
        self.ttft = Ewma(alpha)
        self.tpot = Ewma(alpha)
        # What this deployment usually does: a slow average that a sudden slowdown barely moves,
        # kept across probation (the deployment is judged against it when it comes back).
        self.ttft_baseline = Ewma(baseline_alpha)
        self.tpot_baseline = Ewma(baseline_alpha)
        self._clock = clock
        self.degraded_until = 0.0

    @property
    def degraded(self) -> bool:
        # Probation ends on any read, not only when a request is planned: otherwise a peer's
        # finished request could judge this deployment again on the numbers it was degraded
        # for, and keep it degraded, cooldown after cooldown, without it serving anything.
        self.end_probation_if_due()
        return self._clock() < self.degraded_until

    def record(self, ttft_s: float, tpot_s: float | None) -> None:
        self.ttft.add(ttft_s)
        self.ttft_baseline.add(ttft_s)
        if tpot_s is not None:
            self.tpot.add(tpot_s)
            self.tpot_baseline.add(tpot_s)

    def degrade(self, cooldown_s: float) -> None:
        self.degraded_until = self._clock() + cooldown_s

    def end_probation_if_due(self) -> None:
        if self.degraded_until and self._clock() >= self.degraded_until:
            self.degraded_until = 0.0
            self.ttft.reset()
            self.tpot.reset()


def _too_slow(mine: Ewma, peers: Sequence[Ewma], settings: SlowDetectionSettings, min_gap_s: float) -> bool:
    if mine.value is None or mine.samples < settings.min_samples:
        return False
    values = [p.value for p in peers if p.value is not None and p.samples >= settings.min_samples]
    if not values:
        return False
    median = statistics.median(values)
    return mine.value > settings.factor * median and mine.value - median >= min_gap_s


def _slower_than(
    stats: LatencyStats, ttfts: Sequence[Ewma], tpots: Sequence[Ewma], settings: SlowDetectionSettings
) -> bool:
    return _too_slow(stats.ttft, ttfts, settings, settings.min_ttft_gap_s) or _too_slow(
        stats.tpot, tpots, settings, settings.min_tpot_gap_s
    )


def find_slow(group: Sequence[LatencyStats], settings: SlowDetectionSettings) -> list[int]:
    """Indexes of deployments whose TTFT or TPOT is `factor` x above their peers' median, or
    above their own baseline.

    Peers exclude the deployment itself: with two deployments the median of both would be
    their mean, and a deployment 1.5x slower than its only peer would sit at just 1.2x of it.
    The baseline matters when the deployment is the only one with traffic (a `priority`
    primary): its peers then have no numbers to compare with.
    """
    slow = []
    for i, stats in enumerate(group):
        if stats.degraded:
            continue
        peers = [s for j, s in enumerate(group) if j != i and not s.degraded]
        if _slower_than(stats, [p.ttft for p in peers], [p.tpot for p in peers], settings) or _slower_than(
            stats, [stats.ttft_baseline], [stats.tpot_baseline], settings
        ):
            slow.append(i)
    return slow
