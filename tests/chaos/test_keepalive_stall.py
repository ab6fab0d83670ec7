"""Backends that look alive and say nothing (issue 29 item 11): a stream of SSE comments after the
first token(s), and a health endpoint that answers 200 and never finishes its body.

Comments must not keep a stalled answer alive; the first stall opens the deployment's breaker at
once, so that answers waiting on it meanwhile fail over instead of each waiting out its own stall
timeout; and a model whose only deployment is in that state is not ready."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from common.processes import Announced
from testkit.procs import GatewayProcess, deployment, gateway_config, gateway_process, reset, set_faults, start_sim
from tests.chaos.replicas import parse, text_of

pytestmark = pytest.mark.chaos

BODY = {"model": "sim-model", "messages": [{"role": "user", "content": "keep talking"}], "max_tokens": 8}
STALL_S = 2.0


@pytest.fixture(scope="module")
def good() -> Iterator[Announced]:
    process = start_sim()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def bad() -> Iterator[Announced]:
    process = start_sim()
    try:
        yield process
    finally:
        process.stop()


def faulty(sim: Announced, stall_s: float = STALL_S, **overrides: Any) -> dict[str, Any]:
    return deployment("a", sim, timeouts={"connect_s": 1, "first_token_s": 2, "stall_s": stall_s}, **overrides)


def expected_text(sim: Announced) -> str:
    """The answer a healthy sim gives (every sim gives the same one)."""
    reply = httpx.post(f"{sim.url}/v1/chat/completions", json=BODY, timeout=10)
    return str(reply.json()["choices"][0]["message"]["content"])


def timed_stream(gateway: GatewayProcess, results: list[tuple[float, str]], bound_s: float = 15.0) -> None:
    """One streamed request; appends (seconds it took, its text), or (inf, "") when it was still
    going after `bound_s` (the gateway's own keep-alives would keep a read timeout from firing)."""
    started = time.monotonic()
    lines: list[str] = []
    url = f"{gateway.url}/v1/chat/completions"
    try:
        with httpx.stream("POST", url, json={**BODY, "stream": True}, headers=gateway.headers(), timeout=30) as reply:
            assert reply.status_code == 200, reply.read()
            for line in reply.iter_lines():
                if time.monotonic() - started > bound_s:
                    break
                lines.append(line)
            else:
                results.append((time.monotonic() - started, text_of(parse(lines))))
                return
    except httpx.TimeoutException:
        pass
    results.append((float("inf"), ""))


def in_threads(count: int, gateway: GatewayProcess, results: list[tuple[float, str]]) -> list[threading.Thread]:
    threads = [threading.Thread(target=timed_stream, args=(gateway, results)) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads


def readiness(gateway: GatewayProcess) -> tuple[int, dict[str, Any]]:
    reply = httpx.get(f"{gateway.url}/readyz", timeout=5)
    return reply.status_code, reply.json()


def seconds_until_not_ready(gateway: GatewayProcess, bound_s: float) -> float:
    """Polled every 50 ms, for at most `bound_s`; inf if it stayed ready."""
    started = time.monotonic()
    while time.monotonic() - started < bound_s:
        if readiness(gateway)[0] == 503:
            return time.monotonic() - started
        time.sleep(0.05)
    return float("inf")


def wait_for_fault(sim: Announced, name: str, count: int = 1, bound_s: float = 10.0) -> None:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        fired = httpx.get(f"{sim.url}/sim/control", timeout=5).json()["counters"]["faults_fired"]
        if fired.get(name, 0) >= count:
            return
        time.sleep(0.02)
    raise AssertionError(f"the sim's {name} fault did not fire {count} time(s) in {bound_s:g}s")


@pytest.mark.parametrize("fault", ["stall_after", "keepalive_after"])
def test_comments_after_the_first_tokens_are_a_stall_like_silence(
    tmp_path: Path, good: Announced, bad: Announced, fault: str
) -> None:
    set_faults(bad, **{fault: 2})
    config = gateway_config(faulty(bad, stall_s=1.0), deployment("b", good, priority=1))
    with gateway_process(tmp_path, config) as gateway:
        results: list[tuple[float, str]] = []
        timed_stream(gateway, results)
        [(took, text)] = results
        # Cut one stall after its second token and continued by b: the whole answer, once.
        assert took < 1.0 + 1.5, f"{fault}: took {took:.2f}s"
        assert text == expected_text(good)


def test_answers_waiting_on_a_stalled_deployment_fail_over_when_its_first_stall_opens_the_breaker(
    tmp_path: Path, good: Announced, bad: Announced
) -> None:
    set_faults(bad, keepalive_after=1)
    config = gateway_config(faulty(bad), deployment("b", good, priority=1))
    with gateway_process(tmp_path, config) as gateway:
        first: list[tuple[float, str]] = []
        threads = in_threads(1, gateway, first)
        wait_for_fault(bad, "keepalive")
        # Half a stall timeout later, 7 more answers are waiting on `a` when the first one stalls.
        time.sleep(STALL_S / 2)
        waiting: list[tuple[float, str]] = []
        threads += in_threads(7, gateway, waiting)
        for thread in threads:
            thread.join(30)
        assert readiness(gateway)[1]["models"]["sim-model"]["deployments"]["a"] == "open"
        later: list[tuple[float, str]] = []
        for thread in in_threads(8, gateway, later):
            thread.join(30)
    answer = expected_text(good)
    assert [text for _, text in first + waiting + later] == [answer] * 16
    [(first_took, _)] = first
    assert STALL_S * 0.9 < first_took < STALL_S + 1.5
    # The 7 end with the first stall (half a stall timeout after they began), not a stall after it.
    assert max(took for took, _ in waiting) < STALL_S * 0.75, sorted(took for took, _ in waiting)
    # Afterwards nothing waits on `a` at all.
    assert max(took for took, _ in later) < 1.0, sorted(took for took, _ in later)


def test_a_model_whose_only_deployment_stalls_in_comments_is_not_ready_after_one_stall(
    tmp_path: Path, bad: Announced
) -> None:
    config = gateway_config(faulty(bad, stall_s=1.0))
    with gateway_process(tmp_path, config) as gateway:
        assert readiness(gateway)[0] == 200
        set_faults(bad, keepalive_after=1)
        results: list[tuple[float, str]] = []
        [thread] = in_threads(1, gateway, results)
        wait_for_fault(bad, "keepalive")
        took = seconds_until_not_ready(gateway, bound_s=6.0)
        assert took < 1.0 + 1.0, f"still ready {took:.2f}s after the stream went silent"
        status, ready = readiness(gateway)
        assert status == 503
        assert ready["models"]["sim-model"]["ready"] is False
        assert ready["models"]["sim-model"]["deployments"]["a"] == "open"
        reset(bad)
        thread.join(30)


def test_a_model_whose_only_deployment_drips_its_health_answer_is_not_ready_within_one_probe(
    tmp_path: Path, bad: Announced
) -> None:
    health = {"interval_s": 0.5, "timeout_s": 0.5, "unhealthy_after": 1}
    config = gateway_config(faulty(bad), routing={"health": health})
    with gateway_process(tmp_path, config) as gateway:
        assert readiness(gateway)[0] == 200
        set_faults(bad, drip_health=True)
        took = seconds_until_not_ready(gateway, bound_s=6.0)
        # At most one interval until the next probe, then its timeout.
        assert took < 0.5 + 0.5 + 1.0, f"still ready {took:.2f}s after /health began to drip"
        status, ready = readiness(gateway)
        assert status == 503
        assert ready["models"]["sim-model"] == {"ready": False, "deployments": {"a": "unhealthy"}}
        reset(bad)
        assert seconds_until_ready(gateway, bound_s=6.0) < 6.0


def seconds_until_ready(gateway: GatewayProcess, bound_s: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < bound_s:
        if readiness(gateway)[0] == 200:
            return time.monotonic() - started
        time.sleep(0.05)
    return float("inf")
