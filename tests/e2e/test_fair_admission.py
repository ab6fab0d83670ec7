"""Fair admission: a client that retries before the Retry-After it was given is refused at once,
without a chance at capacity or quota, so hammering gains nothing over waiting as told."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from common.processes import Announced
from testkit.procs import Gateway, deployment, gateway_config, running_gateway

BODY = {"model": "sim-model", "messages": [{"role": "user", "content": "may I?"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def gateway(sim_pair: list[Announced], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with running_gateway(tmp_path_factory.mktemp("fair"), gateway_config(deployment("a", sim_pair[0]))) as running:
        yield running


def post(gateway: Gateway, key: str) -> httpx.Response:
    return httpx.post(f"{gateway.url}/v1/chat/completions", json=BODY, headers=gateway.headers(key), timeout=30)


def test_a_retry_before_retry_after_is_refused_without_a_chance(gateway: Gateway) -> None:
    _, hammering = gateway.create_key(rpm=1)
    _, patient = gateway.create_key(rpm=1)
    assert post(gateway, hammering).status_code == 200
    limited = post(gateway, hammering)
    assert limited.status_code == 429
    assert limited.json()["error"]["code"] == "rate_limit_exceeded"
    told = int(limited.headers["Retry-After"])
    early = post(gateway, hammering)
    assert early.status_code == 429
    assert early.json()["error"]["code"] == "retry_too_early"
    assert 1 <= int(early.headers["Retry-After"]) <= told
    # Another client is judged on its own.
    assert post(gateway, patient).status_code == 200
