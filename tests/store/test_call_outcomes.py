"""The store-call tally readiness reads (gateway/store/call_outcomes.py)."""

from __future__ import annotations

from gateway.settings import StoreReadinessSettings
from gateway.store.call_outcomes import CallOutcomes


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def outcomes(clock: Clock, window_s: int, min_failures: int, failure_ratio: float) -> CallOutcomes:
    settings = StoreReadinessSettings(
        window_s=window_s, min_failures=min_failures, failure_ratio=failure_ratio, recovered_after_s=1.0
    )
    return CallOutcomes(settings, clock=clock)


def test_failures_past_the_ratio_and_the_minimum_are_a_problem() -> None:
    clock = Clock()
    tally = outcomes(clock, window_s=5, min_failures=5, failure_ratio=0.2)
    for _ in range(20):
        tally.record(failed=False)
    for _ in range(4):
        tally.record(failed=True)
    assert tally.problem() is None  # 4 failures: under the minimum
    tally.record(failed=True)
    assert tally.problem() == "5 of 25 store calls failed in the last 5 s"


def test_a_few_failures_among_many_calls_are_not() -> None:
    clock = Clock()
    tally = outcomes(clock, window_s=5, min_failures=5, failure_ratio=0.2)
    for _ in range(100):
        tally.record(failed=False)
    for _ in range(10):
        tally.record(failed=True)
    assert tally.problem() is None  # 10 of 110 is under a fifth


def test_failures_older_than_the_window_are_forgotten() -> None:
    clock = Clock()
    tally = outcomes(clock, window_s=3, min_failures=1, failure_ratio=0.5)
    tally.record(failed=True)
    assert tally.problem() is not None
    clock.now += 3
    assert tally.problem() is None
    tally.record(failed=False)  # reuses the slot of the second that left the window
    clock.now += 1
    tally.record(failed=True)
    assert tally.problem() == "1 of 2 store calls failed in the last 3 s"


def test_a_second_without_a_failed_call_is_a_recovery_before_the_window_ends() -> None:
    clock = Clock()
    tally = outcomes(clock, window_s=5, min_failures=5, failure_ratio=0.2)
    for _ in range(10):
        tally.record(failed=True)
    clock.now += 0.9
    assert tally.problem() is not None  # 10 of 10 failed, the last 0.9 s ago
    clock.now += 0.1
    assert tally.problem() is None  # the window still holds them; a second without one is enough
    tally.record(failed=True)  # a lost slot range fails again within a few calls
    assert tally.problem() is not None


def test_many_calls_that_work_between_failures_are_no_recovery() -> None:
    clock = Clock()
    tally = outcomes(clock, window_s=5, min_failures=5, failure_ratio=0.2)
    for _ in range(10):
        for _ in range(20):  # the probe's and the audit chain's slots are served
            tally.record(failed=False)
        tally.record(failed=True)
        for _ in range(5):
            tally.record(failed=True)
        clock.now += 0.2
    assert tally.problem() is not None  # 60 of 260 failed, the last 0.2 s ago
