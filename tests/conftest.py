from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.cli.processes import Announced
from tests.procs import reset, start_sim


@pytest.fixture(scope="session")
def sim_pair() -> Iterator[list[Announced]]:
    """Two fast simulated backends shared by the tests that do not kill them."""
    sims = [start_sim(), start_sim()]
    try:
        yield sims
    finally:
        for sim in sims:
            sim.stop()


@pytest.fixture
def sims(sim_pair: list[Announced]) -> list[Announced]:
    for sim in sim_pair:
        reset(sim)
    return sim_pair
