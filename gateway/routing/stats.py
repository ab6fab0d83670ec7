"""Latency statistics per deployment and passive detection of slow-but-alive deployments.

A deployment that answers, but slowly, passes every health probe and never trips a breaker; it
only drags the tail. So each deployment keeps an EWMA of TTFT and TPOT, and one whose EWMA
exceeds `factor` x the median of its peers' (or, when no peer has numbers, as for a `priority`
primary with all the traffic, `factor` x its own baseline: a much slower EWMA of the same
samples) is marked degraded for `cooldown_s`. Degraded
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
    # A plain mean of the first `warmup` samples, so that a slow average is not just its first sample.
    warmup: int = 0

    def add(self, sample: float) -> None:
        self.samples += 1
        weight = max(self.alpha, 1.0 / self.samples) if self.samples <= self.warmup else self.alpha
        self.value = sample if self.value is None else self.value + weight * (sample - self.value)

    def reset(self) -> None:
        self.value = None
        self.samples = 0


class LatencyStats:
    def __init__(
        self,
        alpha: float,
        clock: Callable[[], float] = time.monotonic,
        baseline_alpha: float = 0.02,
        baseline_warmup: int = 10,
    ) -> None:
        self.ttft = Ewma(alpha)
        self.tpot = Ewma(alpha)
        # What this deployment usually does: a slow average that a sudden slowdown barely moves,
        # kept across probation (the deployment is judged against it when it comes back).
        self.ttft_baseline = Ewma(baseline_alpha, warmup=baseline_warmup)
        self.tpot_baseline = Ewma(baseline_alpha, warmup=baseline_warmup)
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


def _too_slow(
    mine: Ewma, peers: Sequence[Ewma], baseline: Ewma | None, settings: SlowDetectionSettings, min_gap_s: float
) -> bool:
    """Slower than the peers' median when peers have numbers, else than its own baseline. Not
    both: when every deployment slows down together (load) none of them is the outlier, and
    moving traffic between them would only shuffle it."""
    if mine.value is None or mine.samples < settings.min_samples:
        return False
    values = [p.value for p in peers if p.value is not None and p.samples >= settings.min_samples]
    if values:
        reference = statistics.median(values)
    elif baseline is not None and baseline.value is not None and baseline.samples >= 2 * settings.min_samples:
        reference = baseline.value
    else:
        return False
    return mine.value > settings.factor * reference and mine.value - reference >= min_gap_s


def find_slow(group: Sequence[LatencyStats], settings: SlowDetectionSettings) -> list[int]:
    """Indexes of deployments whose TTFT or TPOT is `factor` x above their peers' median, or,
    when no peer has numbers, above their own baseline.

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
        # With no ready peer to take its traffic, degrading a deployment would only hand the
        # traffic back to degraded ones: its own baseline is consulted only when one exists.
        ttft_base, tpot_base = (stats.ttft_baseline, stats.tpot_baseline) if peers else (None, None)
        ttft = _too_slow(stats.ttft, [p.ttft for p in peers], ttft_base, settings, settings.min_ttft_gap_s)
        tpot = _too_slow(stats.tpot, [p.tpot for p in peers], tpot_base, settings, settings.min_tpot_gap_s)
        if ttft or tpot:
            slow.append(i)
    return slow
