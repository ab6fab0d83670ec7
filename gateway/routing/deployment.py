"""One deployment as the router sees it: its backend plus everything that decides whether to use it."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from enum import StrEnum

from gateway.backends.base import Backend
from gateway.routing.breaker import BreakerState, CircuitBreaker
from gateway.routing.stats import LatencyStats
from gateway.settings import DeploymentSettings, RoutingSettings


class Availability(StrEnum):
    """Best first: routing prefers READY, then DEGRADED, and uses the last-resort kinds only if
    nothing better is left. OPEN and FULL are never used."""

    READY = "ready"
    DEGRADED = "degraded"  # alive but slow: loses traffic until it recovers
    COOLING = "cooling"  # said 429 with Retry-After; last resort until that passes
    UNHEALTHY = "unhealthy"  # failing active probes; last resort
    OPEN = "open"  # circuit breaker open
    FULL = "full"  # at max_inflight


USABLE = (Availability.READY, Availability.DEGRADED)
LAST_RESORT = (Availability.COOLING, Availability.UNHEALTHY)


class Deployment:
    def __init__(
        self,
        settings: DeploymentSettings,
        backend: Backend,
        routing: RoutingSettings,
        clock: Callable[[], float] = time.monotonic,
        on_breaker_change: Callable[[str, BreakerState], None] | None = None,
    ) -> None:
        """`on_breaker_change` hears (deployment name, new state) of each change of its breaker."""
        self.settings = settings
        self.name = settings.name
        self.backend = backend
        on_change = functools.partial(on_breaker_change, self.name) if on_breaker_change is not None else None
        self.breaker = CircuitBreaker(
            routing.breaker.failure_threshold, routing.breaker.cooldown_s, clock=clock, on_change=on_change
        )
        self.stats = LatencyStats(
            routing.slow.alpha, clock, routing.slow.baseline_alpha, baseline_warmup=2 * routing.slow.min_samples
        )
        self.inflight = 0
        self.healthy = True
        self.failed_probes = 0
        self.cooling_until = 0.0
        self._cut_idle_after_s = routing.breaker.cut_idle_after_s
        self._clock = clock

    def availability(self) -> Availability:
        if self.inflight >= self.settings.max_inflight:
            return Availability.FULL
        if not self.breaker.available():
            return Availability.OPEN
        if not self.healthy:
            return Availability.UNHEALTHY
        if self._clock() < self.cooling_until:
            return Availability.COOLING
        if self.stats.degraded:
            return Availability.DEGRADED
        return Availability.READY

    @property
    def serving(self) -> bool:
        """Counts towards readiness: healthy and not cut off by its breaker."""
        return self.healthy and self.breaker.state is not BreakerState.OPEN

    def stalled(self) -> int:
        """Its own stall or first-token limit ran out on one attempt: open the breaker, and cut the
        attempts still waiting on it that have had no data for a while, so that they fail over now
        rather than each after its own timeout. How many were cut."""
        self.breaker.trip()
        return self.backend.cut_idle(self._cut_idle_after_s)

    def cool_down(self, seconds: float) -> None:
        self.cooling_until = max(self.cooling_until, self._clock() + seconds)

    def record_probe(self, ok: bool, unhealthy_after: int) -> None:
        if ok:
            self.failed_probes = 0
            self.healthy = True
        else:
            self.failed_probes += 1
            if self.failed_probes >= unhealthy_after:
                self.healthy = False
