"""GatewayProcess replicas on a real Redis Cluster (issue 12, scale-out): quotas exact across two
replicas, the audit chain whole and verifiable, a SIGKILLed replica's stream taken over."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from common.processes import Announced
from gateway.audit.writer import iterate
from gateway.auth.stage import new_secret
from gateway.settings import RedisStoreSettings
from gateway.store.redis_store import RedisStore
from testkit.procs import GatewayProcess, deployment, gateway_config, gateway_process, start_sim
from tests.cluster.redis_cluster import RedisCluster

BODY: dict[str, Any] = {"model": "sim-model", "messages": [{"role": "user", "content": "count me"}], "max_tokens": 4}


def cluster_store(cluster: RedisCluster, prefix: str) -> dict[str, Any]:
    return {"kind": "redis", "cluster": True, "url": cluster.url, "key_prefix": prefix, "socket_timeout_s": 3}


async def chain_of(cluster: RedisCluster, prefix: str) -> list[dict[str, Any]]:
    store = RedisStore(RedisStoreSettings(url=cluster.url, cluster=True, key_prefix=prefix, socket_timeout_s=5))
    try:
        return [r.to_dict() async for r in iterate(store)]
    finally:
        await store.aclose()


def audit_verify(gateway: GatewayProcess) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "gateway", "audit", "verify", "--config", str(gateway.config_path)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


async def test_two_replicas_on_a_cluster_admit_exactly_the_limit_and_audit_every_request(
    tmp_path: Path, sim_pair: list[Announced], redis_cluster: RedisCluster
) -> None:
    prefix = f"agw-cluster-{uuid.uuid4().hex[:8]}"
    config = gateway_config(
        deployment("a", sim_pair[0], max_inflight=1000),
        store=cluster_store(redis_cluster, prefix),
        quota={"on_store_error": "fail_closed"},  # a store failure must show, not admit unmetered
        routing={"retry": {"max_attempts": 1}},
    )
    admin_key = new_secret()
    with ExitStack() as stack:
        replicas = [stack.enter_context(gateway_process(tmp_path, config, admin_key=admin_key)) for _ in range(2)]
        _, secret = replicas[0].create_key(rpm=30)
        async with httpx.AsyncClient(timeout=30) as client:

            async def one(i: int) -> int:
                gateway = replicas[i % 2]
                headers = {**gateway.headers(secret), "X-Request-Id": f"q-{i}"}
                reply = await client.post(f"{gateway.url}/v1/chat/completions", json=BODY, headers=headers)
                return reply.status_code

            statuses = Counter(await asyncio.gather(*(one(i) for i in range(120))))
        verified = await asyncio.to_thread(audit_verify, replicas[0])
    records = await chain_of(redis_cluster, prefix)
    audited = Counter(r["request_id"] for r in records if str(r.get("request_id", "")).startswith("q-"))
    assert statuses == Counter({200: 30, 429: 90})
    assert sorted(audited.values()) == [1] * 120
    assert verified.returncode == 0, verified.stdout + verified.stderr


@pytest.fixture
def slow_sim() -> Iterator[Announced]:
    sim = start_sim("--tpot-ms", "10")
    try:
        yield sim
    finally:
        sim.stop()


def test_a_replica_killed_mid_stream_is_taken_over_on_a_cluster(
    tmp_path: Path, slow_sim: Announced, redis_cluster: RedisCluster
) -> None:
    config = gateway_config(
        deployment("a", slow_sim),
        store=cluster_store(redis_cluster, f"agw-cluster-{uuid.uuid4().hex[:8]}"),
        sessions={"lease_ttl_s": 1.0, "checkpoint_interval_s": 0.05, "checkpoint_every_events": 4},
    )
    body = {**BODY, "messages": [{"role": "user", "content": "a resumable answer"}], "max_tokens": 30}
    expected = httpx.post(f"{slow_sim.url}/v1/chat/completions", json=body, timeout=10).json()
    admin_key = new_secret()
    with ExitStack() as stack:
        first = stack.enter_context(gateway_process(tmp_path, config, admin_key=admin_key))
        second = stack.enter_context(gateway_process(tmp_path, config, admin_key=admin_key))
        second.key = first.key
        session_id = f"s-{uuid.uuid4().hex[:8]}"
        lines: list[str] = []
        headers = {**first.headers(), "X-Session-Id": session_id}
        url = f"{first.url}/v1/chat/completions"
        with httpx.stream("POST", url, json={**body, "stream": True}, headers=headers, timeout=20) as reply:
            for line in reply.iter_lines():
                lines.append(line)
                if sum(line.startswith("data: ") for line in lines) == 8:
                    os.kill(first.process.process.pid, signal.SIGKILL)
                    break
        first.process.process.wait(10)
        last_id = max(int(line[4:]) for line in lines if line.startswith("id: "))
        resumed = httpx.get(
            f"{second.url}/v1/sessions/{session_id}/stream",
            headers={**second.headers(), "Last-Event-ID": str(last_id)},
            timeout=30,
        )
    assert resumed.status_code == 200, resumed.text
    events = [line[6:] for line in lines + resumed.text.splitlines() if line.startswith("data: ")]
    text = "".join(
        (orjson.loads(e)["choices"][0]["delta"].get("content") or "")
        for e in events
        if e != "[DONE]" and orjson.loads(e).get("choices")
    )
    assert text == expected["choices"][0]["message"]["content"]
    assert events[-1] == "[DONE]"
