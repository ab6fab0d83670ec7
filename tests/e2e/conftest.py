from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from common.processes import Announced
from testkit.procs import Gateway, deployment, gateway_config, policy_file, running_gateway


@pytest.fixture(scope="module")
def shared_gateway(sim_pair: list[Announced], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """One gateway over the shared sims, for tests that only read."""
    path: Path = tmp_path_factory.mktemp("gateway")
    config = gateway_config(
        deployment("a", sim_pair[0]),
        deployment("b", sim_pair[1], priority=1),
        tools={"policy_file": policy_file(path)},
    )
    with running_gateway(path, config) as gateway:
        yield gateway
