from __future__ import annotations

import pytest

from gateway.admission import RetryDiscipline
from gateway.errors import RetryTooEarly


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_key_told_to_wait_is_refused_until_then_and_admitted_after() -> None:
    clock = Clock()
    discipline = RetryDiscipline(clock=clock)
    discipline.told_to_wait("k1", 1.2)  # the client was sent Retry-After: 2
    clock.now += 0.01
    with pytest.raises(RetryTooEarly) as refused:
        discipline.check("k1")
    assert refused.value.headers()["Retry-After"] == "2"
    discipline.check("k2")  # other keys are judged on their own
    clock.now += 1.99
    discipline.check("k1")
    discipline.check("k1")  # and the entry is gone
    assert discipline.refused == 1


def test_the_wait_is_not_extended_by_early_retries() -> None:
    clock = Clock()
    discipline = RetryDiscipline(clock=clock)
    discipline.told_to_wait("k", 1)
    for _ in range(10):
        clock.now += 0.05
        with pytest.raises(RetryTooEarly):
            discipline.check("k")
    clock.now = 101.0
    discipline.check("k")
