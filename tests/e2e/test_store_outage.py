"""Redis killed under a running gateway: no hang, no crash, behaviour as configured."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from common.processes import Announced
from testkit.procs import GatewayProcess, RedisServer, deployment, gateway_config, gateway_process, start_redis

BODY = {"model": "sim-model", "messages": [{"role": "user", "content": "still there?"}], "max_tokens": 3}


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = start_redis()
    try:
        yield server
    finally:
        server.kill()


async def load(gateway: GatewayProcess, count: int) -> Counter[int]:
    async with httpx.AsyncClient(timeout=5) as client:

        async def one() -> int:
            reply = await client.post(f"{gateway.url}/v1/chat/completions", json=BODY, headers=gateway.headers())
            return reply.status_code

        return Counter(await asyncio.gather(*(one() for _ in range(count))))


def config(sim: Announced, redis_server: RedisServer, mode: str) -> dict[str, object]:
    return gateway_config(
        deployment("a", sim),
        store={"kind": "redis", "url": redis_server.url, "socket_timeout_s": 0.2, "connect_timeout_s": 0.2},
        quota={"on_store_error": mode},
    )


async def test_fail_open_keeps_serving_known_keys_when_redis_dies(
    tmp_path: Path, sim_pair: list[Announced], redis_server: RedisServer
) -> None:
    with gateway_process(tmp_path, config(sim_pair[0], redis_server, "fail_open")) as gateway:
        assert (await load(gateway, 10))[200] == 10  # the key is now in the replica's cache
        redis_server.kill()
        statuses = await load(gateway, 40)  # every one answers within the client timeout
        readiness = await asyncio.to_thread(httpx.get, f"{gateway.url}/readyz", timeout=5)
        assert gateway.process.process.poll() is None, "the gateway did not crash"
    assert statuses == Counter({200: 40})
    # Serving unmetered is a fail-open decision about requests; readiness still tells the
    # orchestrator that this replica cannot use its store (issue 12 item 1).
    assert readiness.status_code == 503
    assert readiness.json()["store"] == "down"


async def test_fail_closed_refuses_with_503_when_redis_dies(
    tmp_path: Path, sim_pair: list[Announced], redis_server: RedisServer
) -> None:
    with gateway_process(tmp_path, config(sim_pair[0], redis_server, "fail_closed")) as gateway:
        gateway.create_key(rpm=1000)  # a key with limits: admission needs the store
        _, limited = gateway.create_key(rpm=1000)
        gateway.key = limited
        assert (await load(gateway, 5))[200] == 5
        redis_server.kill()
        statuses = await load(gateway, 20)
        readiness = await asyncio.to_thread(httpx.get, f"{gateway.url}/readyz", timeout=5)
        assert gateway.process.process.poll() is None
    assert statuses == Counter({503: 20})
    assert readiness.status_code == 503
    assert readiness.json()["store"] == "down"
