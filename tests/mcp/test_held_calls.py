"""Held calls and slow bodies must not stall other tenants, and held calls are capped (issue 29,
item 1). A high-risk MCP call waits for a person for up to its policy's `timeout_s`, a slow body
for up to `server.body_timeout_s`: neither may hold what the audit log needs to record another
tenant's request, and one key may not park more approvals than `tools.max_pending_approvals_*`."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson

from common.processes import Announced
from testkit.procs import Gateway, policy_file, running_gateway
from tests.mcp.client import wait_for_mcp_servers
from tests.mcp.conftest import SECRET, mcp_config
from tests.mcp.test_endpoint import audit_where
from tests.mcp.test_endpoint_edges import MCP_HEADERS, call_tool_raw

QUEUE = 4  # audit slots: the held calls and the slow bodies each fill them all
ANSWER_WITHIN_S = 10.0  # generous: today the request gets no answer at all while the slots are held

POLICY = """
policies:
  agent:
    approval: {mode: wait, timeout_s: 60, ttl_s: 600}
    tools:
      - {name: files__read_file, risk: low}
      - {name: files__delete_file, risk: high}
      - {name: send_email, risk: high, approval_mode: defer}
bindings:
  tenants: {acme: agent}
"""


def held_config(upstream: Announced, tmp_path: Path, sim: Announced, **tools: Any) -> dict[str, Any]:
    config = mcp_config(upstream, tmp_path, sim)
    config["tools"] = {"policy_file": policy_file(tmp_path, POLICY), "approval_secret": SECRET, **tools}
    config["audit"] = {"queue_size": QUEUE, "flush_interval_s": 0.01}
    return config


@contextlib.contextmanager
def gateway_with(upstream: Announced, sim: Announced, tmp_path: Path, **tools: Any) -> Iterator[Gateway]:
    with running_gateway(tmp_path, held_config(upstream, tmp_path, sim, **tools)) as gateway:
        assert wait_for_mcp_servers(gateway)["mcp_servers"]["files"] == "up"
        yield gateway


def delete_call(path: str) -> dict[str, Any]:
    arguments = {"name": "files__delete_file", "arguments": {"path": path}}
    return {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": arguments}


async def pending_count(gateway: Gateway, approver: str) -> int:
    async with httpx.AsyncClient(headers=gateway.headers(approver), timeout=10) as http:
        reply = await http.get(f"{gateway.url}/admin/approvals", params={"status": "pending"})
        return len(reply.json()["data"])


async def until_pending(gateway: Gateway, approver: str, count: int) -> None:
    for _ in range(400):  # 20 s at most
        if await pending_count(gateway, approver) >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"fewer than {count} approvals became pending")


@contextlib.asynccontextmanager
async def held_calls(gateway: Gateway, key: str, count: int) -> AsyncIterator[None]:
    """`count` high-risk calls held for a person; let go (the clients hang up) on exit."""
    _, approver = gateway.create_key(scopes=["approver"])
    already = await pending_count(gateway, approver)
    async with httpx.AsyncClient(headers={**gateway.headers(key), **MCP_HEADERS}, timeout=120) as http:

        async def hold(i: int) -> None:
            await http.post(f"{gateway.url}/mcp", json=delete_call(f"/tmp/held-{i}"))

        tasks = [asyncio.create_task(hold(i)) for i in range(count)]
        try:
            await until_pending(gateway, approver, already + count)
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


@contextlib.asynccontextmanager
async def slow_bodies(gateway: Gateway, key: str, count: int) -> AsyncIterator[None]:
    """`count` chat requests whose head and the first bytes of the body arrive, the rest never."""
    address = urlsplit(gateway.url)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {address.netloc}\r\nAuthorization: Bearer {key}\r\n"
        "Content-Type: application/json\r\nContent-Length: 4096\r\n\r\n"
    )
    writers: list[asyncio.StreamWriter] = []
    try:
        for _ in range(count):
            _, writer = await asyncio.open_connection(address.hostname, address.port)
            writer.write(head.encode() + b'{"model": "sim-model", "messages": [')
            await writer.drain()
            writers.append(writer)
        yield
    finally:
        for writer in writers:
            writer.close()


async def globex_answers(gateway: Gateway, globex: str) -> httpx.Response:
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
    async with httpx.AsyncClient(timeout=ANSWER_WITHIN_S) as http:
        return await http.post(f"{gateway.url}/v1/chat/completions", json=body, headers=gateway.headers(globex))


async def test_held_calls_of_one_key_do_not_stall_another_tenants_chat(
    upstream: Announced, echo_sim: Announced, tmp_path: Path
) -> None:
    with gateway_with(upstream, echo_sim, tmp_path) as gateway:
        _, globex = gateway.create_key(tenant="globex")
        async with held_calls(gateway, gateway.key, QUEUE):
            reply = await globex_answers(gateway, globex)  # httpx.ReadTimeout today
            assert reply.status_code == 200, reply.text
            async with httpx.AsyncClient(timeout=10) as http:  # held calls are not a full audit queue
                assert (await http.get(f"{gateway.url}/readyz")).json()["audit"] == "ok"


async def test_slow_bodies_of_one_key_do_not_stall_another_tenants_chat(
    upstream: Announced, echo_sim: Announced, tmp_path: Path
) -> None:
    with gateway_with(upstream, echo_sim, tmp_path) as gateway:
        _, globex = gateway.create_key(tenant="globex")
        async with slow_bodies(gateway, gateway.key, QUEUE):
            reply = await globex_answers(gateway, globex)
            assert reply.status_code == 200, reply.text


def refusal_text(gateway: Gateway, key: str) -> str:
    """The text of a held call's answer, which must come at once (a refusal, not a hold)."""
    headers = {**gateway.headers(key), **MCP_HEADERS}
    reply = httpx.post(f"{gateway.url}/mcp", json=delete_call("/tmp/one-too-many"), headers=headers, timeout=30)
    assert reply.status_code == 200, reply.text
    data = [line[len("data:") :] for line in reply.text.splitlines() if line.startswith("data:")]
    message = orjson.loads(data[-1]) if data else reply.json()
    result = message["result"]
    assert result["isError"] is True
    return str(result["content"][0]["text"])


async def test_held_mcp_calls_are_capped_per_key_and_per_tenant_and_the_refusal_is_audited(
    upstream: Announced, echo_sim: Announced, tmp_path: Path
) -> None:
    caps = {"max_pending_approvals_per_key": 2, "max_pending_approvals_per_tenant": 3}
    with gateway_with(upstream, echo_sim, tmp_path, **caps) as gateway:
        first_id, first = gateway.create_key()
        second_id, second = gateway.create_key()
        async with held_calls(gateway, first, 2):
            text = await asyncio.wait_for(asyncio.to_thread(refusal_text, gateway, first), ANSWER_WITHIN_S)
            assert text == (
                "The gateway refused to hold the call to 'files__delete_file' for approval: this key already has "
                "2 calls waiting for a decision (tools.max_pending_approvals_per_key). Try again once one is decided."
            )
            async with held_calls(gateway, second, 1):
                text = await asyncio.wait_for(asyncio.to_thread(refusal_text, gateway, second), ANSWER_WITHIN_S)
                assert "this key's tenant already has 3 calls waiting" in text
                assert "tools.max_pending_approvals_per_tenant" in text
            # A key of the tenant still reads files: only holding is capped.
            ok = (await asyncio.to_thread(call_tool_raw, gateway, second, '{"path": "/srv/ok"}'))["result"]
            assert ok["isError"] is False
        for key_id in (first_id, second_id):
            refused = await asyncio.to_thread(audit_where, gateway, refusal_of(key_id))
            assert len(refused) == 1
            assert (refused[0]["decision"], refused[0]["tool"]) == ("deny", "files__delete_file")
            assert refused[0]["approval_id"] is None


def refusal_of(key_id: str) -> Callable[[dict[str, Any]], bool]:
    return lambda record: record["key_id"] == key_id and record["status"] == "too_many_pending"


def defer(gateway: Gateway, key: str) -> httpx.Response:
    tools = [{"type": "function", "function": {"name": "send_email", "parameters": {"type": "object"}}}]
    body = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": "mail them"}],
        "tools": tools,
        "tool_choice": {"type": "function", "function": {"name": "send_email"}},
    }
    return httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=gateway.headers(key), timeout=30)


def test_deferred_chat_calls_are_capped_per_key_with_a_429(
    upstream: Announced, echo_sim: Announced, tmp_path: Path
) -> None:
    caps = {"max_pending_approvals_per_key": 2, "max_pending_approvals_per_tenant": 50}
    with gateway_with(upstream, echo_sim, tmp_path, **caps) as gateway:
        key_id, key = gateway.create_key()
        for _ in range(2):
            assert defer(gateway, key).headers["X-Approval-Status"] == "pending"
        refused = defer(gateway, key)
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert error["code"] == "too_many_pending_approvals"
        assert error["type"] == "rate_limit_error"
        assert "2 calls waiting for a decision" in error["message"]
        assert "Retry-After" in refused.headers
        records = audit_where_kind(gateway, "request", key_id, 3)
        assert [r["status"] for r in records] == [200, 200, 429]
        assert records[-1]["error"] == "too_many_pending_approvals"
        decisions = [r["decision"] for r in audit_where_kind(gateway, "policy", key_id, 3)]
        assert decisions == ["approval_requested", "approval_requested", "approval_refused"]


def audit_where_kind(gateway: Gateway, kind: str, key_id: str, count: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for _ in range(200):
        reply = httpx.get(
            f"{gateway.url}/admin/audit",
            params={"kind": kind, "limit": 1000},
            headers=gateway.headers(gateway.admin_key),
            timeout=10,
        )
        found = [r for r in reply.json()["data"] if r["key_id"] == key_id]
        if len(found) >= count:
            break
        threading.Event().wait(0.05)
    return sorted(found, key=lambda r: r["seq"])
