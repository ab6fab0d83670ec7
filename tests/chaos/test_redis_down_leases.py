"""Redis down for 2 s under streaming requests with concurrency limits: no lease outlives it
(issue 12 item 4: a 2 s outage used to hold concurrency leases for the whole 60 s lease TTL)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from common.processes import Announced
from gateway.store import keys
from testkit.procs import deployment, gateway_config, gateway_process, start_sim
from tests.chaos.redis_chaos import audited, private_redis

pytestmark = pytest.mark.chaos

STREAMS = 4


@pytest.fixture
def slow_sim() -> Iterator[Announced]:
    sim = start_sim("--tpot-ms", "40")  # 30 tokens: a stream of ~1.2 s
    try:
        yield sim
    finally:
        sim.stop()


async def test_redis_down_for_2s_leaks_no_concurrency_lease(tmp_path: Path, slow_sim: Announced) -> None:
    with private_redis(tmp_path) as server:
        config = gateway_config(
            deployment("a", slow_sim),
            # Killed, not stalled: refusals are immediate; the timeout only has to outlast a slow fsync.
            store={"kind": "redis", "url": server.url, "key_prefix": "chaos", "socket_timeout_s": 2},
            quota={"on_store_error": "fail_open", "lease_ttl_s": 60},
        )
        with gateway_process(tmp_path, config) as gateway:
            key_id, gateway.key = gateway.create_key(max_concurrency=STREAMS)
            leases = keys.scope_keys("chaos", "acme", f"key:{key_id}").leases
            body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 30}
            started = asyncio.Event()
            begun: set[int] = set()  # streams, not chunks: one fast stream must not stand for all

            async def stream(client: httpx.AsyncClient, i: int) -> int:
                url = f"{gateway.url}/v1/chat/completions"
                headers = {**gateway.headers(), "X-Request-Id": f"down-{i}"}
                async with client.stream("POST", url, json={**body, "stream": True}, headers=headers) as r:
                    async for _ in r.aiter_bytes():
                        begun.add(i)
                        if len(begun) == STREAMS:
                            started.set()
                    return r.status_code

            async with httpx.AsyncClient(timeout=15) as client:
                streams = [asyncio.create_task(stream(client, i)) for i in range(STREAMS)]
                await asyncio.wait_for(started.wait(), timeout=10)
                assert server.client().zcard(leases) == STREAMS  # every stream holds its lease
                server.kill()  # the streams end while Redis is down: their settles fail
                statuses = await asyncio.wait_for(asyncio.gather(*streams), timeout=15)
                await asyncio.to_thread(server.restart_after, 2.0 - 1.2)
            back = time.monotonic()
            redis_client = server.client()
            while redis_client.zcard(leases) > 0:  # the lease TTL is 60 s: 15 s proves it was freed
                assert time.monotonic() - back < 15, "concurrency leases still held after Redis came back"
                await asyncio.sleep(0.05)
            freed_after_s = time.monotonic() - back
            while True:  # the records queued during the outage reach the chain by themselves
                ids = Counter(r.get("request_id") for r in await audited(server))
                if all(ids[f"down-{i}"] for i in range(STREAMS)):
                    break
                assert time.monotonic() - back < 15, "audit records of the outage never written"
                await asyncio.sleep(0.1)
            verify = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "gateway", "audit", "verify", "--config", str(gateway.config_path)],
                capture_output=True,
                text=True,
                timeout=60,
            )
    assert statuses == [200] * STREAMS
    assert [ids[f"down-{i}"] for i in range(STREAMS)] == [1] * STREAMS
    assert verify.returncode == 0, verify.stdout + verify.stderr
    print(f"\nredis down 2 s: streams={STREAMS} statuses={statuses} leases freed after {freed_after_s:.2f} s")
