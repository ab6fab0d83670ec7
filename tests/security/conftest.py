"""A gateway per module over the shared sims, with a small audit queue: a leaked audit slot shows
up as a hang after a handful of requests, not after ten thousand."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from common.processes import Announced, start_announcing
from testkit.procs import Gateway, deployment, gateway_config, policy_file, running_gateway
from tests.security.helpers import REFUSAL_INTERVAL_S, SECURITY_POLICY


@pytest.fixture(scope="module")
def gateway(sim_pair: list[Announced], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    path: Path = tmp_path_factory.mktemp("security")
    config = gateway_config(
        deployment("a", sim_pair[0]),
        audit={"queue_size": 4, "flush_interval_s": 0.01, "refusal_interval_s": REFUSAL_INTERVAL_S},
        tools={"policy_file": policy_file(path, SECURITY_POLICY)},
    )
    with running_gateway(path, config) as running:
        yield running


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A gateway over `scripted_upstream`, for upstream behaviour the sim never shows."""
    path: Path = tmp_path_factory.mktemp("scripted")
    upstream = start_announcing(["tests.security.scripted_upstream", "--port", "0"])
    try:
        config = gateway_config(
            deployment("up", upstream),
            tools={"policy_file": policy_file(path, SECURITY_POLICY)},
        )
        with running_gateway(path, config) as running:
            yield running
    finally:
        upstream.stop()
