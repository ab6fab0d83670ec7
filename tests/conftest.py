from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.cli.processes import Announced
from tests.cluster.redis_cluster import RedisCluster, running_cluster
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


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """A real Redis Cluster on loopback (3 masters, a replica each), started once for the session
    by the first test that asks: the store contract suite and tests/cluster run on it. Tests that
    kill a node start a cluster of their own."""
    with running_cluster(tmp_path_factory.mktemp("redis-cluster")) as cluster:
        yield cluster
