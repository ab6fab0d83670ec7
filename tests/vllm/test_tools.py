"""Tool calls from a real parser: vLLM with `--enable-auto-tool-choice --tool-call-parser hermes`
(the tiny model's template writes Hermes-style `<tool_call>{json}</tool_call>`), under the
gateway's policy: a whitelisted call passes, a call to a tool the policy does not list is blocked,
a high-risk call waits for a person, and an engine killed inside a call never leaves half of it
with the client: the call is generated again, whole, by the other engine."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit.procs import GatewayProcess, gateway_process, policy_file
from tests.e2e.test_tool_policy import approve_when_pending, tool
from tests.vllm.client import chat_body, stream_through, vllm_deployment, vllm_gateway_config
from tests.vllm.conftest import Pool
from tests.vllm.tap import Tap
from tests.vllm.test_failover import request_audit

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

POLICY = """
policies:
  agent:
    approval: {mode: wait, timeout_s: 60, ttl_s: 600}
    tools:
      - {name: get_weather, risk: low}
      - {name: refund_payment, risk: high}
bindings:
  tenants: {acme: agent}
"""
TOOLS = {
    "get_weather": tool("get_weather", "city"),
    "delete_file": tool("delete_file", "path"),
    "refund_payment": tool("refund_payment", "order_id", "amount"),
}


def ask(prompt: str, *tools: str) -> dict[str, Any]:
    return chat_body(prompt, max_tokens=120, tools=[TOOLS[t] for t in tools])


def calls(events: list[Any]) -> list[dict[str, Any]]:
    """The client's tool calls, assembled from its deltas."""
    assembled: dict[int, dict[str, Any]] = {}
    for event in events:
        for choice in event.get("choices", ()) if isinstance(event, dict) else ():
            for delta in choice["delta"].get("tool_calls") or ():
                call = assembled.setdefault(delta["index"], {"name": "", "arguments": ""})
                call["name"] += delta.get("function", {}).get("name") or ""
                call["arguments"] += delta.get("function", {}).get("arguments") or ""
    return [assembled[i] for i in sorted(assembled)]


@pytest.fixture
def gateway(pool: Pool, tmp_path: Path) -> Iterator[tuple[GatewayProcess, Tap]]:
    """Engine a behind a tap (so a test can kill it inside a call), b as the fallback."""
    a, b = pool.ready("a", "b")
    tap = Tap(a.port)
    config = vllm_gateway_config(
        vllm_deployment("a", a, via=tap.url, priority=0),
        vllm_deployment("b", b, priority=1),
        tools={"policy_file": policy_file(tmp_path, POLICY)},
    )
    try:
        with gateway_process(tmp_path, config) as running:
            yield running, tap
    finally:
        tap.close()


def test_whitelisted_call_passes_and_a_call_to_an_unlisted_tool_is_blocked(gateway: tuple[GatewayProcess, Tap]) -> None:
    gw, _ = gateway
    allowed = stream_through(gw, ask("What is the weather in Paris?", "get_weather"))
    assert calls(allowed.events) == [{"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}]
    assert allowed.finish_reasons == ["tool_calls"]
    # delete_file is stripped from the offer, but the model calls it anyway: the gateway blocks it.
    blocked = stream_through(gw, ask("Delete the file notes.txt.", "get_weather", "delete_file"))
    assert calls(blocked.events) == []
    assert "The gateway blocked a call to 'delete_file'" in blocked.text


def test_high_risk_call_waits_for_approval(gateway: tuple[GatewayProcess, Tap]) -> None:
    gw, _ = gateway
    _, approver = gw.create_key(scopes=["approver"])
    decided: list[Any] = []
    human = threading.Thread(target=approve_when_pending, args=(gw, approver, "refund_payment", decided))
    human.start()
    result = stream_through(gw, ask("Refund order ord_42.", "refund_payment"))
    human.join(30)
    assert decided[0]["status"] == "approved"
    assert calls(result.events) == [
        {"name": "refund_payment", "arguments": json.dumps({"order_id": "ord_42", "amount": 5})}
    ]


def test_engine_killed_inside_a_call_restarts_the_call_on_the_other(
    pool: Pool, gateway: tuple[GatewayProcess, Tap], figures: dict[str, Any]
) -> None:
    gw, tap = gateway
    trigger = tap.arm(1, pool.servers["a"].kill)  # after the call's first delta: half a call
    try:
        result = stream_through(gw, ask("What is the weather in Paris?", "get_weather"))
    finally:
        pool.restart("a")
    assert trigger.fired
    assert not result.errors, result.errors
    assert calls(result.events) == [{"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}]
    assert request_audit(gw)["deployments"] == ["a", "b"]
    figures["tool_call_killed_after_deltas"] = 1
