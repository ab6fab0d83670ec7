"""Failover drill (issue 12, scale-out): the master holding the audit chain's slot is SIGKILLed
while two replicas serve traffic; Redis Cluster promotes its replica. Every replica must recover
by itself, and nothing acknowledged may be lost: one audit record per answered request, the chain
verifying, and no concurrency lease left behind.

A cluster of its own (a node dies here), three masters with a replica each, node timeout 1 s.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import pytest

from common.processes import Announced
from gateway.auth.stage import new_secret
from testkit.procs import deployment, gateway_config, gateway_process
from tests.chaos.redis_chaos import Tally, steady_load, wait_ready
from tests.cluster.redis_cluster import running_cluster
from tests.cluster.test_gateway_on_cluster import audit_verify, chain_of, cluster_store

pytestmark = pytest.mark.chaos


async def test_a_master_killed_under_load_is_replaced_and_nothing_acknowledged_is_lost(
    tmp_path: Path, sim_pair: list[Announced]
) -> None:
    prefix = f"agw-drill-{uuid.uuid4().hex[:8]}"
    with running_cluster(tmp_path / "cluster") as cluster, ExitStack() as stack:
        victim = cluster.master_of(f"{prefix}:{{audit}}:head")
        entry = next(n for n in cluster.nodes if n is not victim)  # replicas and the CLI start from it
        store = {**cluster_store(cluster, prefix), "url": f"redis://127.0.0.1:{entry.port}/0"}
        config = gateway_config(
            deployment("a", sim_pair[0], max_inflight=1000),
            store={**store, "socket_timeout_s": 0.5, "connect_timeout_s": 0.5},
            quota={"on_store_error": "fail_open"},
            routing={"retry": {"max_attempts": 1}},
        )
        admin_key = new_secret()
        replicas = [stack.enter_context(gateway_process(tmp_path, config, admin_key=admin_key)) for _ in range(2)]
        _, secret = replicas[0].create_key(rpm=1_000_000, max_concurrency=1000)
        for gateway in replicas:
            gateway.key = secret
        await steady_load(replicas, asyncio.Event(), Tally(), concurrency=2, max_requests=4, label="warm")

        tally, stop = Tally(), asyncio.Event()
        load = asyncio.create_task(steady_load(replicas, stop, tally, concurrency=8, max_requests=4000))
        while tally.total < 100:  # traffic before the kill
            assert not load.done()
            await asyncio.sleep(0.05)
        killed_at = time.monotonic()
        await asyncio.to_thread(victim.kill)
        while cluster.master_of(f"{prefix}:{{audit}}:head") is victim:  # until a replica is promoted
            assert time.monotonic() - killed_at < 30, "no replica promoted"
            await asyncio.sleep(0.05)
        promoted_after = time.monotonic() - killed_at
        await asyncio.to_thread(cluster.wait_ok, 30.0)
        ready_after = max([await wait_ready(g, within_s=30) for g in replicas]) + time.monotonic() - killed_at
        after = tally.total
        while tally.total < after + 100:  # traffic after the failover
            assert not load.done()
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(load, timeout=30)
        deadline = time.monotonic() + 30
        while True:  # each replica writes what it queued during the failover by itself
            records = await chain_of(cluster, prefix)
            audited = Counter(r.get("request_id") for r in records)
            missing = [i for i in tally.request_ids if audited[i] == 0]
            if not missing or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        verified = await asyncio.to_thread(audit_verify, replicas[0])
    print(
        f"\nfailover drill: requests={tally.total} statuses={dict(tally.statuses)}"
        f" promoted_after={promoted_after:.2f}s ready_after={ready_after:.2f}s"
        f" audit_records_lost={len(missing)} duplicated={sum(1 for i in tally.request_ids if audited[i] > 1)}"
        f" verify_rc={verified.returncode}"
    )
    assert tally.statuses == Counter({200: tally.total}), tally.failures
    assert not missing, f"{len(missing)} answered requests have no audit record"
    assert all(audited[i] == 1 for i in tally.request_ids)
    assert verified.returncode == 0, verified.stdout + verified.stderr
