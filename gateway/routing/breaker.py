"""Per-deployment circuit breaker: closed -> open -> half-open -> closed.

Open after `failure_threshold` consecutive failures, or at once when `trip`ped (a deployment's own
stall or first-token timeout); after `cooldown_s` one trial request is let through (half-open); its
success closes the breaker, its failure opens it for another cooldown.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import StrEnum


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    def __init__(
        self,
        failure_threshold: int,
        cooldown_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[BreakerState], None] | None = None,
    ) -> None:
        self._threshold = failure_threshold
        self._cooldown_s = cooldown_s
        self._clock = clock
        self._on_change = on_change
        self._failures = 0
        self._opened_at = 0.0
        self._open = False
        self._trial_in_flight = False

    @property
    def state(self) -> BreakerState:
        if not self._open:
            return BreakerState.CLOSED
        if self._clock() - self._opened_at >= self._cooldown_s:
            return BreakerState.HALF_OPEN
        return BreakerState.OPEN

    def available(self) -> bool:
        """Would a request be let through now? (Does not take the half-open trial.)"""
        state = self.state
        return state is BreakerState.CLOSED or (state is BreakerState.HALF_OPEN and not self._trial_in_flight)

    def acquire(self) -> bool:
        """Let one request through; in half-open state only one at a time."""
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.HALF_OPEN and not self._trial_in_flight:
            self._trial_in_flight = True
            return True
        return False

    def record_success(self) -> None:
        self._failures = 0
        self._trial_in_flight = False
        if self._open:
            self._open = False
            self._notify(BreakerState.CLOSED)

    def release(self) -> None:
        """The request ended without a verdict on the deployment (the client went away)."""
        self._trial_in_flight = False

    def record_failure(self) -> None:
        self._failures += 1
        was_trial = self._trial_in_flight
        self._trial_in_flight = False
        if was_trial or (not self._open and self._failures >= self._threshold):
            self._open = True
            self._opened_at = self._clock()
            self._notify(BreakerState.OPEN)

    def trip(self) -> None:
        """Open now, whatever the count: the deployment went silent past its own limit, and every
        request it holds or is sent meanwhile would wait as long. Already open: the cooldown keeps
        running from the first trip (a half-open trial's failure opens it again)."""
        self._failures += 1
        was_trial = self._trial_in_flight
        self._trial_in_flight = False
        if was_trial or self.state is not BreakerState.OPEN:
            self._open = True
            self._opened_at = self._clock()
            self._notify(BreakerState.OPEN)

    def _notify(self, state: BreakerState) -> None:
        if self._on_change is not None:
            self._on_change(state)
