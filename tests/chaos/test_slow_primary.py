"""A primary that turns slow (alive, answering, passing probes) is drained under every routing
strategy, also when it is the only deployment with traffic (`priority`): it is compared with its
own baseline, not only with its peers' live traffic.

Stated bound: drained after at most DRAIN_BOUND slow answers from the primary (the EWMA needs a
few slow answers to cross `factor` x the baseline or the peers' median; the first request after
the fault is at most `min_samples` answers into a fresh measurement). The time this took is printed
(figures in the README's Operations section)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from common.processes import Announced
from testkit.procs import deployment, gateway_config, reset, served_count, set_faults, start_sim
from tests.chaos.replicas import Replicas, replicas_on_redis

pytestmark = pytest.mark.chaos

BODY = {"model": "sim-model", "messages": [{"role": "user", "content": "steady work"}], "max_tokens": 10}
WARM_UP = 10
DRAIN_BOUND = 8
QUIET = 5
MAX_SENT = 60
RPM = 1000


@pytest.fixture(scope="module")
def sims() -> Iterator[list[Announced]]:
    # The secondary is a little slower, so that `lowest_latency` prefers the primary until its fault.
    started = [start_sim("--ttft-ms", "40", "--tpot-ms", "5"), start_sim("--ttft-ms", "60", "--tpot-ms", "5")]
    try:
        yield started
    finally:
        for sim in started:
            sim.stop()


def ask(group: Replicas) -> None:
    gateway = group.live[0]
    reply = httpx.post(f"{gateway.url}/v1/chat/completions", json=BODY, headers=gateway.headers(), timeout=30)
    assert reply.status_code == 200, reply.text


def availability(group: Replicas, name: str) -> str:
    ready = httpx.get(f"{group.live[0].url}/readyz", timeout=10).json()
    return str(ready["models"]["sim-model"]["deployments"][name])


@pytest.mark.parametrize("strategy", ["priority", "weighted", "least_inflight", "lowest_latency"])
def test_a_slow_primary_is_drained(tmp_path: Path, sims: list[Announced], strategy: str) -> None:
    primary, secondary = sims
    for sim in sims:
        reset(sim)
    config = gateway_config(
        deployment("a", primary), deployment("b", secondary, priority=1), routing={"strategy": strategy}
    )
    with replicas_on_redis(tmp_path, config, count=1) as group:
        group.use_key(rpm=RPM)
        for _ in range(WARM_UP):
            ask(group)
        set_faults(primary, slow=3)
        started, quiet, sent, slow_answers = time.monotonic(), 0, 0, 0
        # Drained: marked degraded, or (lowest_latency, whose order moves traffic off by itself
        # before min_samples) QUIET requests in a row that did not reach it. Random orders may
        # pass the primary over for a while, so the bound is on the slow answers it served.
        while sent < MAX_SENT:
            before = served_count(primary)
            ask(group)
            sent += 1
            reached = served_count(primary) > before
            slow_answers += reached
            quiet = 0 if reached else quiet + 1
            if availability(group, "a") == "degraded" or (strategy == "lowest_latency" and quiet == QUIET):
                break
        took = time.monotonic() - started
        print(f"{strategy}: drained after {slow_answers} slow answers ({sent} requests), {took:.2f}s")
        assert slow_answers <= DRAIN_BOUND, f"{strategy}: {slow_answers} slow answers, still not drained"
        before = served_count(primary)
        for _ in range(QUIET):
            ask(group)
        assert served_count(primary) == before, f"{strategy}: the slow primary still gets traffic"
        sent += QUIET
        records = group.audit_when(lambda found: len(found) >= WARM_UP + sent)
        assert len(records) == WARM_UP + sent
        assert all(r["status"] == 200 for r in records)
        assert group.remaining_requests() == RPM - WARM_UP - sent - 1
        assert group.verify()["ok"]
