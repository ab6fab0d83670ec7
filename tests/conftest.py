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
def sims(sim_pair: list[Announced]) -> Iterator[list[Announced]]:
    """The shared sims, healthy: faults a test sets are cleared before and after it, so tests
    that use `sim_pair` directly never meet a leftover fault."""
    for sim in sim_pair:
        reset(sim)
    yield sim_pair
    for sim in sim_pair:
        reset(sim)
