"""A primary that turns slow (alive, answering, passing probes) is drained under every routing
strategy, also when it is the only deployment with traffic (`priority`): it is compared with its
own baseline, not only with its peers' live traffic.

Stated bound: drained within DRAIN_BOUND requests of the fault (the EWMA needs `min_samples`
slow answers plus a few more to cross `factor` x the baseline)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.cli.processes import Announced
from tests.chaos.replicas import Replicas, replicas_on_redis
from tests.procs import deployment, gateway_config, reset, served_count, set_faults, start_sim

pytestmark = pytest.mark.chaos

BODY = {"model": "sim-model", "messages": [{"role": "user", "content": "steady work"}], "max_tokens": 10}
WARM_UP = 10
DRAIN_BOUND = 15
QUIET = 5  # drained: this many requests in a row without one reaching the primary
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
        started, quiet, sent = time.monotonic(), 0, 0
        while quiet < QUIET and sent < DRAIN_BOUND + QUIET:
            before = served_count(primary)
            ask(group)
            sent += 1
            quiet = quiet + 1 if served_count(primary) == before else 0
        drained_after = sent - quiet
        print(f"{strategy}: drained after {drained_after} requests, {time.monotonic() - started:.2f}s")
        assert quiet == QUIET, f"{strategy}: the slow primary still had traffic after {sent} requests"
        assert drained_after <= DRAIN_BOUND
        if strategy != "lowest_latency":  # that order itself moves traffic off before min_samples
            assert availability(group, "a") == "degraded"
        records = group.audit()
        assert len(records) == WARM_UP + sent
        assert all(r["status"] == 200 for r in records)
        assert group.remaining_requests() == RPM - WARM_UP - sent - 1
        assert group.verify()["ok"]
