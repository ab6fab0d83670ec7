from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from common.processes import Announced
from testkit.procs import Gateway, deployment, gateway_config, policy_file, running_gateway, start_sim
from tests.e2e.test_tool_policy import POLICY


@pytest.fixture(scope="module")
def quoting_sim() -> Iterator[Announced]:
    """A sim that answers a tool result by quoting it: an agent's final answer shows its tool's."""
    sim = start_sim("--echo-tool-results")
    try:
        yield sim
    finally:
        sim.stop()


@pytest.fixture(scope="module")
def gateway(quoting_sim: Announced, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    path: Path = tmp_path_factory.mktemp("gateway")
    config = gateway_config(
        deployment("a", quoting_sim), tools={"policy_file": policy_file(path, POLICY)}
    )  # refund_payment waits for a person
    with running_gateway(path, config) as served:
        yield served
