"""Health on real vLLM: /health probed, an engine stopped with SIGSTOP (alive, port open, silent)
mid-stream and between requests, then resumed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.procs import Gateway, running_gateway
from tests.vllm.client import chat_body, direct_answer, stream_through, vllm_deployment, vllm_gateway_config
from tests.vllm.conftest import Pool
from tests.vllm.tap import Tap
from tests.vllm.test_failover import request_audit

# Engine starts and the model build happen in the first test's fixtures: minutes, not seconds.
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

PROBES = {"interval_s": 0.5, "timeout_s": 1.0, "unhealthy_after": 2}
STALL_S = 3  # a stream silent this long is dead: the SIGSTOPped engine's stream fails over


def availability(gateway: Gateway) -> dict[str, str]:
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
        with running_gateway(tmp_path, config) as gateway:
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
