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
        window_s=window_s, min_failures=min_failures, failure_ratio=failure_ratio, recovered_after=20
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


def test_a_run_of_calls_that_work_is_a_recovery_at_once() -> None:
    clock = Clock()
    tally = outcomes(clock, window_s=5, min_failures=5, failure_ratio=0.2)
    for _ in range(10):
        tally.record(failed=True)
    for _ in range(19):
        tally.record(failed=False)
    assert tally.problem() is not None  # 10 of 29 failed, and the run is one short
    tally.record(failed=False)
    assert tally.problem() is None
    tally.record(failed=True)  # a lost slot range fails again within a few calls
    assert tally.problem() is not None
