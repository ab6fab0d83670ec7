"""Readiness follows the store errors live traffic sees (issue 29 item 10). A cluster that lost a
slot range (a master and its replica) fails every call to those slots while the readiness probe's
slot is still served; with `cluster-require-full-coverage no` the cluster never declares itself
failed, so a probe alone says "ready" for as long as the outage lasts (and with the default it
said so for the seconds until the cluster did: 4.4 s in the drill)."""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from common.processes import Announced
from testkit.procs import GatewayProcess, deployment, gateway_config, gateway_process
from tests.cluster.redis_cluster import running_cluster
from tests.cluster.test_gateway_on_cluster import cluster_store

pytestmark = pytest.mark.chaos

BODY: dict[str, Any] = {"model": "sim-model", "messages": [{"role": "user", "content": "which slot?"}], "max_tokens": 2}


def ask_in_a_new_session(client: httpx.Client, gateway: GatewayProcess) -> httpx.Response:
    """A request naming a session of its own: its keys land in a slot of their own."""
    headers = {**gateway.headers(), "X-Session-Id": f"s-{uuid.uuid4().hex}"}
    return client.post(f"{gateway.url}/v1/chat/completions", json=BODY, headers=headers)


def test_a_lost_slot_range_makes_the_replica_not_ready_though_its_probe_is_served(
    tmp_path: Path, sim_pair: list[Announced]
) -> None:
    prefix = f"agw-slots-{uuid.uuid4().hex[:8]}"
    options = ("--cluster-require-full-coverage", "no")
    with running_cluster(tmp_path / "cluster", options=options) as cluster:
        probed = cluster.master_of(f"{prefix}:{{audit}}:epoch")  # the probe's (and the audit chain's) slot
        victim = next(n for n in cluster.masters() if n is not probed)
        entry = probed  # the client discovers the others from a node that stays
        store = {**cluster_store(cluster, prefix), "url": f"redis://127.0.0.1:{entry.port}/0", "socket_timeout_s": 0.5}
        config = gateway_config(deployment("a", sim_pair[0]), store=store, quota={"on_store_error": "fail_open"})
        with gateway_process(tmp_path, config) as gateway, httpx.Client(timeout=20) as client:
            assert client.get(f"{gateway.url}/readyz").status_code == 200
            replica = cluster.replica_of(victim)
            victim.kill()
            replica.kill()
            unresumable, ready = 0, None
            for _ in range(200):  # bounded: enough requests for a third of them to meet the lost slots
                reply = ask_in_a_new_session(client, gateway)
                assert reply.status_code == 200, reply.text  # answered, without a checkpoint where needed
                unresumable += reply.headers.get("x-session-resumable") == "false"
                ready = client.get(f"{gateway.url}/readyz")
                if ready.status_code == 503:
                    break
            assert unresumable > 0, "no request met the lost slots"
            assert ready is not None
            assert ready.status_code == 503, ready.text
            body = ready.json()
            assert body["store"] == "failing"
            assert "store calls failed" in body["store_error"]
            # The probe's slot is still served: it is live traffic that says so.
            with contextlib.closing(probed.client()) as probe:
                assert probe.get(f"{prefix}:{{audit}}:epoch") is not None
