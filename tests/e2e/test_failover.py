"""Failover before the first token, circuit breaking and slow-backend draining, on real processes."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from common.processes import Announced
from testkit.procs import (
    Gateway,
    deployment,
    gateway_config,
    running_gateway,
    served_count,
    set_faults,
    start_sim,
)

BODY = {"model": "sim-model", "messages": [{"role": "user", "content": "failover please"}], "max_tokens": 8}


def expected_text(sim: Announced) -> str:
    reply = httpx.post(f"{sim.url}/v1/chat/completions", json=BODY, timeout=10).json()
    return str(reply["choices"][0]["message"]["content"])


def ask(gateway: Gateway, **extra: object) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/v1/chat/completions", json={**BODY, **extra}, headers=gateway.headers(), timeout=15
    )


@pytest.fixture
def own_sims() -> Iterator[list[Announced]]:
    """Sims this test may kill."""
    sims = [start_sim(), start_sim()]
    try:
        yield sims
    finally:
        for sim in sims:
            sim.stop()


def test_sigkilled_first_deployment_fails_over_to_the_second(tmp_path: Path, own_sims: list[Announced]) -> None:
    first, second = own_sims
    expected = expected_text(second)
    config = gateway_config(deployment("a", first), deployment("b", second, priority=1))
    with running_gateway(tmp_path, config) as gateway:
        assert ask(gateway).status_code == 200
        os.kill(first.process.pid, signal.SIGKILL)
        first.process.wait(10)
        reply = ask(gateway)
    assert reply.status_code == 200
    assert reply.json()["choices"][0]["message"]["content"] == expected


@pytest.mark.parametrize(
    ("faults", "reason"),
    [
        ({"status": 503}, "503"),
        ({"status": 429, "retry_after": 1}, "429 with Retry-After"),
        ({"stall_after": 0}, "stall before the first token"),
    ],
)
def test_failing_first_deployment_fails_over_before_the_first_token(
    tmp_path: Path, sims: list[Announced], faults: dict[str, object], reason: str
) -> None:
    first, second = sims
    expected = expected_text(second)
    served_before = served_count(second)
    set_faults(first, **faults)
    config = gateway_config(
        deployment("a", first, timeouts={"connect_s": 1, "first_token_s": 0.5, "stall_s": 0.5}),
        deployment("b", second, priority=1),
    )
    with running_gateway(tmp_path, config) as gateway:
        streamed = ask(gateway, stream=True)
        reply = ask(gateway)
    assert reply.status_code == 200, reason
    assert reply.json()["choices"][0]["message"]["content"] == expected, reason
    assert streamed.text.endswith("data: [DONE]\n\n"), reason
    assert "error" not in streamed.text, reason
    assert served_count(second) == served_before + 2, reason


def test_circuit_breaker_opens_then_half_opens_and_closes(tmp_path: Path, sims: list[Announced]) -> None:
    first, second = sims
    set_faults(first, status=500)
    config = gateway_config(
        deployment("a", first),
        deployment("b", second, priority=1),
        routing={"breaker": {"failure_threshold": 2, "cooldown_s": 1}},
    )
    with running_gateway(tmp_path, config) as gateway:
        for _ in range(2):
            assert ask(gateway).status_code == 200
        readiness = httpx.get(f"{gateway.url}/readyz", timeout=5).json()
        assert readiness["models"]["sim-model"]["deployments"]["a"] == "open"
        before = served_count(first)
        assert ask(gateway).status_code == 200
        assert served_count(first) == before, "an open breaker sends no traffic"

        set_faults(first)  # the backend recovers; after the cooldown one trial request is let through
        wait_for_availability(gateway, "a", "ready", within_s=10)
        assert ask(gateway).status_code == 200
        assert served_count(first) == before + 1
        readiness = httpx.get(f"{gateway.url}/readyz", timeout=5).json()
        assert readiness["models"]["sim-model"]["deployments"]["a"] == "ready"


def wait_for_availability(gateway: Gateway, name: str, wanted: str, within_s: float) -> None:
    """Poll readiness until `wanted` or a deadline: a breaker cooldown is itself a matter of time."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        readiness = httpx.get(f"{gateway.url}/readyz", timeout=5).json()
        if readiness["models"]["sim-model"]["deployments"][name] == wanted:
            return
        time.sleep(0.05)
    pytest.fail(f"{name} did not become {wanted} within {within_s}s")


def test_mid_stream_cut_ends_with_an_in_band_error_not_a_silent_200(tmp_path: Path, sims: list[Announced]) -> None:
    first, second = sims
    set_faults(first, cut_after=3)
    config = gateway_config(
        deployment("a", first, continuation="none"), deployment("b", second, priority=1, continuation="none")
    )
    with running_gateway(tmp_path, config) as gateway:
        reply = ask(gateway, stream=True)
    events = [line for line in reply.text.splitlines() if line.startswith("data: ")]
    assert reply.status_code == 200
    assert '"error"' in events[-2]
    assert events[-1] == "data: [DONE]"


@pytest.mark.timing
def test_slow_deployment_is_detected_as_degraded_and_drained(tmp_path: Path) -> None:
    timing = ["--ttft-ms", "30", "--tpot-ms", "10"]
    slow, fast = start_sim(*timing, "--slow", "1.5"), start_sim(*timing)
    try:
        config = gateway_config(
            deployment("slow", slow),
            deployment("fast", fast),
            routing={
                "strategy": "weighted",
                "slow": {
                    "factor": 1.3,
                    "min_samples": 3,
                    "alpha": 0.3,
                    "min_ttft_gap_s": 0.004,
                    "min_tpot_gap_s": 0.002,
                },
            },
        )
        with running_gateway(tmp_path, config) as gateway:
            for _ in range(40):
                assert ask(gateway).status_code == 200
            readiness = httpx.get(f"{gateway.url}/readyz", timeout=5).json()
            assert readiness["models"]["sim-model"]["deployments"]["slow"] == "degraded"
            assert readiness["models"]["sim-model"]["deployments"]["fast"] == "ready"
            before = served_count(slow)
            for _ in range(10):
                assert ask(gateway).status_code == 200
            assert served_count(slow) == before, "a degraded deployment gets no traffic while a ready one exists"
    finally:
        slow.stop()
        fast.stop()
