from __future__ import annotations

import pytest

from gateway.errors import RetryTooEarly
from gateway.quota.admission import RetryDiscipline


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_key_told_to_wait_is_refused_until_then_and_admitted_after() -> None:
    clock = Clock()
    discipline = RetryDiscipline(clock=clock)
    discipline.told_to_wait("k1", 1.2)  # the client was sent Retry-After: 2
    discipline.check("k2")  # other keys are judged on their own
    clock.now += 2.0
    discipline.check("k1")
    discipline.check("k1")  # and the entry is gone


def test_an_early_retry_is_refused_and_starts_the_wait_again() -> None:
    clock = Clock()
    discipline = RetryDiscipline(clock=clock)
    discipline.told_to_wait("k", 1)
    clock.now += 0.5
    with pytest.raises(RetryTooEarly) as refused:
        discipline.check("k")
    assert refused.value.headers()["Retry-After"] == "1"
    clock.now += 0.9  # 1.4 s after the 429, but only 0.9 s after the early retry
    with pytest.raises(RetryTooEarly):
        discipline.check("k")
    clock.now += 1.0  # waited as told since the last early retry
    discipline.check("k")
    assert discipline.refused == 2
