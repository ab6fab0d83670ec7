"""Health on real vLLM: /health probed, an engine stopped with SIGSTOP (alive, port open, silent)
mid-stream and between requests, then resumed; an engine kept slow by a SIGSTOP/SIGCONT duty
cycle is found by passive slow detection."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from testkit.procs import GatewayProcess, gateway_process
from tests.vllm.client import chat_body, direct_answer, stream_through, vllm_deployment, vllm_gateway_config
from tests.vllm.conftest import Pool
from tests.vllm.servers import VllmServer
from tests.vllm.tap import Tap
from tests.vllm.test_failover import request_audit

# Engine starts and the model build happen in the first test's fixtures: minutes, not seconds.
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

PROBES = {"interval_s": 0.5, "timeout_s": 1.0, "unhealthy_after": 2}
STALL_S = 3  # a stream silent this long is dead: the SIGSTOPped engine's stream fails over


def availability(gateway: GatewayProcess) -> dict[str, str]:
    body = httpx.get(f"{gateway.url}/readyz", timeout=10).json()
    return dict(body["models"]["tiny"]["deployments"])


def wait_for(condition: Any, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not {what} within {timeout_s:g}s"
        time.sleep(0.1)


def test_sigstopped_engine_fails_over_mid_stream_is_probed_unhealthy_and_comes_back(
    pool: Pool, tmp_path: Path, figures: dict[str, Any]
) -> None:
    a, b = pool.ready("a", "b")
    body = chat_body(max_tokens=380)
    expected = direct_answer(b, body)["choices"][0]["message"]["content"]
    timeouts = {"connect_s": 2, "first_token_s": 60, "stall_s": STALL_S}
    tap = Tap(a.port)  # the stop lands after exactly 50 output events
    trigger = tap.arm(50, a.pause, close=False)
    config = vllm_gateway_config(
        vllm_deployment("a", a, via=tap.url, priority=0, timeouts=timeouts),
        vllm_deployment("b", b, priority=1, timeouts=timeouts),
        routing={"health": PROBES},
    )
    try:
        with gateway_process(tmp_path, config) as gateway:
            wait_for(lambda: availability(gateway) == {"a": "ready", "b": "ready"}, "both ready")

            # Stopped mid-stream: the stall deadline ends the silent attempt and b continues it.
            started = time.monotonic()
            result = stream_through(gateway, body)
            figures["sigstop_stream_s"] = round(time.monotonic() - started, 2)
            assert trigger.fired
            assert not result.errors, result.errors
            assert result.text == expected
            assert request_audit(gateway)["deployments"] == ["a", "b"]

            # Still stopped: probes time out, a is unhealthy, new requests go straight to b.
            wait_for(lambda: availability(gateway)["a"] == "unhealthy", "a unhealthy")
            figures["sigstop_unhealthy_after_s"] = round(time.monotonic() - started, 2)
            assert httpx.get(f"{gateway.url}/readyz", timeout=10).status_code == 200  # b serves
            quick = stream_through(gateway, chat_body("Say hello.", max_tokens=40))
            assert quick.text == "Hello from the tiny model."
            assert request_audit(gateway)["deployments"] == ["b"]

            # Resumed: probes pass again and the primary takes its traffic back.
            a.resume()
            wait_for(lambda: availability(gateway)["a"] == "ready", "a ready again")
            again = stream_through(gateway, chat_body("Say hello.", max_tokens=40))
            assert again.text == "Hello from the tiny model."
            assert request_audit(gateway)["deployments"] == ["a"]
    finally:
        a.resume()
        tap.close()


class Throttle:
    """Keeps an engine alive but slow: SIGSTOP for `stopped_s`, SIGCONT for `running_s`, over and over."""

    def __init__(self, server: VllmServer, stopped_s: float = 0.06, running_s: float = 0.02) -> None:
        self._server = server
        self._times = (stopped_s, running_s)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Throttle:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join(10)
        self._server.resume()

    def _run(self) -> None:
        stopped_s, running_s = self._times
        while not self._done.is_set():
            self._server.pause()
            self._done.wait(stopped_s)
            self._server.resume()
            self._done.wait(running_s)


def test_a_throttled_engine_is_detected_as_slow_and_loses_its_traffic(
    pool: Pool, tmp_path: Path, figures: dict[str, Any]
) -> None:
    a, b = pool.ready("a", "b")
    slow = {"factor": 1.5, "min_samples": 3, "cooldown_s": 300, "min_ttft_gap_s": 0.02, "min_tpot_gap_s": 0.002}
    config = vllm_gateway_config(
        vllm_deployment("a", a),
        vllm_deployment("b", b),
        routing={"strategy": "weighted", "slow": slow},
    )
    with gateway_process(tmp_path, config) as gateway, Throttle(a):
        sent = 0
        while sent < 60 and availability(gateway)["a"] != "degraded":  # weighted: both get measured
            assert stream_through(gateway, chat_body("Say hello.", max_tokens=40)).text == "Hello from the tiny model."
            sent += 1
        assert availability(gateway) == {"a": "degraded", "b": "ready"}
        figures["throttled_engine_degraded_after_requests"] = sent
        # Degraded: behind every ready deployment, so new requests go to b.
        stream_through(gateway, chat_body("Say hello.", max_tokens=40))
        assert request_audit(gateway)["deployments"] == ["b"]
