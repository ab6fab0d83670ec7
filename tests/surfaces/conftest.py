from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from common.processes import Announced
from testkit.procs import Gateway, deployment, gateway_config, policy_file, running_gateway
from tests.e2e.test_tool_policy import POLICY


@pytest.fixture(scope="module")
def gateway(echo_sim: Announced, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    path: Path = tmp_path_factory.mktemp("gateway")
    config = gateway_config(
        deployment("a", echo_sim), tools={"policy_file": policy_file(path, POLICY)}
    )  # refund_payment waits for a person
    with running_gateway(path, config) as served:
        yield served
