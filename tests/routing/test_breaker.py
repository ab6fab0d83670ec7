from gateway.routing.breaker import BreakerState, CircuitBreaker


def state(breaker: CircuitBreaker) -> BreakerState:
    """Read through a call: mypy would keep the property's type narrowed by one assert across the
    calls that change it, and call the next assert unreachable."""
    return breaker.state


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_breaker_opens_after_consecutive_failures_and_half_opens_after_cooldown() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failure_threshold=3, cooldown_s=10, clock=clock)
    for _ in range(2):
        breaker.record_failure()
    assert state(breaker) is BreakerState.CLOSED
    breaker.record_failure()
    assert state(breaker) is BreakerState.OPEN
    assert not breaker.acquire()
    clock.now = 10.0
    assert state(breaker) is BreakerState.HALF_OPEN
    assert breaker.acquire()
    assert not breaker.acquire(), "half-open lets exactly one trial through"


def test_successful_trial_closes_the_breaker() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failure_threshold=1, cooldown_s=5, clock=clock)
    breaker.record_failure()
    clock.now = 5.0
    assert breaker.acquire()
    breaker.record_success()
    assert state(breaker) is BreakerState.CLOSED


def test_failed_trial_reopens_for_a_full_cooldown() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failure_threshold=1, cooldown_s=5, clock=clock)
    breaker.record_failure()
    clock.now = 5.0
    assert breaker.acquire()
    breaker.record_failure()
    assert state(breaker) is BreakerState.OPEN
    clock.now = 9.9
    assert state(breaker) is BreakerState.OPEN
    clock.now = 10.0
    assert state(breaker) is BreakerState.HALF_OPEN


def test_success_resets_the_consecutive_failure_count() -> None:
    breaker = CircuitBreaker(failure_threshold=2, cooldown_s=5, clock=Clock())
    breaker.record_failure()
    breaker.record_success()
    breaker.record_failure()
    assert state(breaker) is BreakerState.CLOSED


def test_abandoned_trial_frees_the_half_open_slot() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failure_threshold=1, cooldown_s=1, clock=clock)
    breaker.record_failure()
    clock.now = 1.0
    assert breaker.acquire()
    breaker.release()
    assert breaker.acquire()


def test_a_trip_opens_at_once_and_keeps_the_cooldown_of_the_first_trip() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failure_threshold=5, cooldown_s=10, clock=clock)
    breaker.trip()
    assert state(breaker) is BreakerState.OPEN
    clock.now = 6.0
    breaker.trip()  # another attempt cut by the same stall: the cooldown does not start again
    clock.now = 10.0
    assert state(breaker) is BreakerState.HALF_OPEN
    assert breaker.acquire()
    breaker.trip()  # the trial stalled too
    assert state(breaker) is BreakerState.OPEN
    clock.now = 20.0
    assert breaker.acquire()
    breaker.record_success()
    assert state(breaker) is BreakerState.CLOSED
