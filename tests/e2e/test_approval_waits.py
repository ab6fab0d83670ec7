"""What an agent learns while its tool call waits for a person, and what an approval id is good
for afterwards: the id and status from the first byte (header, status endpoint), keep-alive bytes
for a non-streamed wait, expiry with the wait, one collection per approval, metered like any
request."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from common.processes import Announced
from testkit.procs import Gateway, deployment, gateway_config, policy_file, running_gateway
from tests.e2e.test_tool_policy import POLICY, SECRET, TOOLS, ask, message_of

KEEPALIVE_S = 0.2


@pytest.fixture(scope="module")
def gateway(sim_pair: list[Announced], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    path: Path = tmp_path_factory.mktemp("approval-waits")
    tools = {"policy_file": policy_file(path, POLICY), "approval_secret": SECRET, "wait_keepalive_s": KEEPALIVE_S}
    with running_gateway(path, gateway_config(deployment("a", sim_pair[0]), tools=tools)) as running:
        yield running


def request(gateway: Gateway, key: str, tool: str, **extra: Any) -> tuple[str, dict[str, Any], dict[str, str]]:
    headers = {**gateway.headers(key), **extra.pop("headers", {})}
    body = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": "please act"}],
        "tools": [TOOLS[tool]],
        "tool_choice": {"type": "function", "function": {"name": tool}},
        **extra,
    }
    return f"{gateway.url}/v1/chat/completions", body, headers


def approvals_api(gateway: Gateway, key: str) -> httpx.Client:
    return httpx.Client(base_url=f"{gateway.url}/admin/approvals", headers=gateway.headers(key), timeout=10)


@pytest.mark.parametrize("stream", [False, True])
def test_a_waiting_request_gets_its_approval_id_before_the_decision(gateway: Gateway, stream: bool) -> None:
    _, approver = gateway.create_key(scopes=["approver"])
    url, body, headers = request(gateway, gateway.key, "refund_payment", stream=stream)
    with httpx.stream("POST", url, json=body, headers=headers, timeout=30) as reply:
        approval_id = reply.headers["X-Approval-Id"]  # the headers came while the call is held
        assert reply.headers["X-Approval-Status"] == "pending"
        status = httpx.get(f"{gateway.url}/v1/approvals/{approval_id}", headers=gateway.headers(), timeout=10)
        assert status.status_code == 200, status.text
        assert status.json()["status"] == "pending"
        raw = reply.iter_raw()
        first = next(raw)  # bytes flow while the person has not decided yet
        assert first
        if not stream:
            assert first.strip() == b"", "a non-streamed wait is kept alive with whitespace before the JSON"
        with approvals_api(gateway, approver) as api:
            assert api.post(f"/{approval_id}/approve", json={"reason": "fine"}).status_code == 200
        text = first + b"".join(raw)
    assert b'"approval_token"' in text
    assert (
        httpx.get(f"{gateway.url}/v1/approvals/{approval_id}", headers=gateway.headers(), timeout=10).json()["status"]
        == "approved"
    )


def test_only_the_requesting_key_reads_its_approval_status(gateway: Gateway) -> None:
    approval_id = ask(gateway, gateway.key, "send_email", choose="send_email").headers["X-Approval-Id"]
    _, colleague = gateway.create_key()
    url = f"{gateway.url}/v1/approvals/{approval_id}"
    assert httpx.get(url, headers=gateway.headers(colleague), timeout=10).status_code == 404
    own = httpx.get(url, headers=gateway.headers(), timeout=10).json()
    assert own["status"] == "pending"
    assert "arguments" not in own  # the status, not the call: that is delivered with X-Approval-Id


def test_a_streamed_defer_request_carries_the_approval_id_header(gateway: Gateway) -> None:
    reply = ask(gateway, gateway.key, "send_email", choose="send_email", stream=True)
    assert reply.status_code == 200
    approval_id = reply.headers["X-Approval-Id"]
    assert approval_id in reply.text


def test_a_wait_that_times_out_expires_the_approval(gateway: Gateway) -> None:
    _, key = gateway.create_key(tenant="hastyco")
    _, approver = gateway.create_key(tenant="hastyco", scopes=["approver"])
    reply = ask(gateway, key, "refund_payment", choose="refund_payment")
    assert "expired" in message_of(reply)["content"]
    approval_id = reply.headers["X-Approval-Id"]
    with approvals_api(gateway, approver) as api:
        assert api.get(f"/{approval_id}").json()["status"] == "expired"
        late = api.post(f"/{approval_id}/approve", json={"reason": "too late"})
        assert late.status_code == 409, "nobody waits for this decision any more"


def test_an_approval_id_is_collected_once_for_the_same_conversation(gateway: Gateway) -> None:
    _, approver = gateway.create_key(scopes=["approver"])
    approval_id = ask(gateway, gateway.key, "send_email", choose="send_email").headers["X-Approval-Id"]
    with approvals_api(gateway, approver) as api:
        assert api.post(f"/{approval_id}/approve", json={"reason": "ok"}).status_code == 200
    collect = {"X-Approval-Id": approval_id}
    other = ask(gateway, gateway.key, "send_email", headers=collect, messages=[{"role": "user", "content": "other"}])
    assert other.status_code == 400, other.text
    assert "conversation" in other.json()["error"]["message"]
    delivered = message_of(ask(gateway, gateway.key, "send_email", headers=collect))
    assert delivered["tool_calls"][0]["approval_id"] == approval_id
    again = ask(gateway, gateway.key, "send_email", headers=collect)
    assert again.status_code == 409, again.text


def test_collecting_an_approval_is_metered_like_any_request(gateway: Gateway) -> None:
    _, key = gateway.create_key(rpm=2)
    approval_id = ask(gateway, key, "send_email", choose="send_email").headers["X-Approval-Id"]  # request 1
    collect = {"X-Approval-Id": approval_id}
    assert ask(gateway, key, "send_email", headers=collect).status_code == 200  # 2: still pending
    limited = ask(gateway, key, "send_email", headers=collect)  # 3 within the minute
    assert limited.status_code == 429, limited.text
