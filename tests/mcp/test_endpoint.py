"""The gateway's MCP endpoint with the SDK's client: the whitelist, argument rules, approval held
and decided, upstream failures, and the audit trail of each step."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import MCPError

from testkit.procs import Gateway
from tests.e2e.test_tool_policy import approve_when_pending
from tests.mcp.client import mcp_session, text_of, wait_for_mcp_servers

ALLOWED = {
    "files__read_file",
    "files__delete_file",
    "files__big",
    "local__read_file",
    "local__slow_echo",
    "hasty__slow_echo",
}


@pytest.fixture(autouse=True)
def servers_up(gateway: Gateway) -> None:
    body = wait_for_mcp_servers(gateway)
    assert body["mcp_servers"] == {"files": "up", "local": "up", "hasty": "up"}


def audit_where(gateway: Gateway, wanted: Callable[[dict[str, Any]], bool], count: int = 1) -> list[dict[str, Any]]:
    """The `mcp` records that match, once at least `count` of them are written (the audit writer
    flushes in the background; bounded wait)."""
    found: list[dict[str, Any]] = []
    for _ in range(200):
        found = [r for r in audit_of(gateway) if wanted(r)]
        if len(found) >= count:
            break
        threading.Event().wait(0.05)
    return found


def audit_of(gateway: Gateway, kind: str = "mcp") -> list[dict[str, Any]]:
    reply = httpx.get(
        f"{gateway.url}/admin/audit",
        params={"kind": kind, "limit": 1000},
        headers=gateway.headers(gateway.admin_key),
        timeout=10,
    )
    return list(reply.json()["data"])


def reject_when_pending(gateway: Gateway, approver: str, tool: str, results: list[Any]) -> None:
    client = httpx.Client(base_url=f"{gateway.url}/admin", headers=gateway.headers(approver), timeout=10)
    for _ in range(600):  # 30 s at most
        listed = client.get("/approvals", params={"status": "pending"}).json()["data"]
        pending = [a for a in listed if a["tool"] == tool]
        if pending:
            results.append(client.post(f"/approvals/{pending[0]['id']}/reject", json={"reason": "not today"}).json())
            return
        threading.Event().wait(0.05)


async def test_list_shows_a_key_only_the_tools_its_policy_allows(gateway: Gateway) -> None:
    async with mcp_session(gateway) as session:
        listed = {t.name for t in (await session.list_tools()).tools}
    assert listed == ALLOWED  # shutdown and the stdio server's other tools are not on the whitelist
    _, stranger = gateway.create_key(tenant="nobody")
    async with mcp_session(gateway, stranger) as session:
        assert (await session.list_tools()).tools == []  # no policy: no tools


async def test_a_tool_not_on_the_whitelist_cannot_be_called_even_by_name(gateway: Gateway) -> None:
    async with mcp_session(gateway) as session:
        result = await session.call_tool("files__shutdown", {})
    assert result.is_error
    assert text_of(result) == "Unknown tool: files__shutdown"
    assert audit_where(gateway, lambda r: r["tool"] == "files__shutdown" and r["decision"] == "deny")


async def test_bad_arguments_are_refused_naming_the_argument(gateway: Gateway) -> None:
    async with mcp_session(gateway) as session:
        result = await session.call_tool("files__delete_file", {"path": "/etc/passwd"})
    assert result.is_error
    assert "path" in text_of(result)
    assert "refused" in text_of(result)


async def test_an_allowed_call_is_forwarded_and_audited(gateway: Gateway) -> None:
    async with mcp_session(gateway) as session:
        result = await session.call_tool("files__read_file", {"path": "/srv/a.txt"})
    assert not result.is_error
    assert text_of(result) == "contents of /srv/a.txt"
    record = audit_where(gateway, lambda r: r["tool"] == "files__read_file")[-1]
    assert (record["decision"], record["status"], record["server"]) == ("allow", "ok", "files")
    assert record["tenant"] == "acme"


async def test_a_risky_call_is_held_with_progress_then_runs_with_a_token_the_server_verifies(gateway: Gateway) -> None:
    _, approver = gateway.create_key(scopes=["approver"])
    decided: list[Any] = []
    human = threading.Thread(target=approve_when_pending, args=(gateway, approver, "files__delete_file", decided))
    human.start()
    messages: list[str] = []

    # The SDK's progress callback protocol: its parameters by these names.
    async def heard(progress: float, total: float | None, message: str | None) -> None:
        messages.append(message or "")

    async with mcp_session(gateway) as session:
        result = await session.call_tool("files__delete_file", {"path": "/tmp/old.log"}, progress_callback=heard)
    await asyncio.to_thread(human.join, 30)
    approval_id = decided[0]["id"]
    assert not result.is_error
    assert text_of(result) == f"deleted /tmp/old.log [approval {approval_id} verified]"
    assert messages
    assert f"approval id {approval_id}" in messages[0]
    steps = audit_where(gateway, lambda r: r.get("approval_id") == approval_id)
    assert [(r["decision"], r["status"]) for r in steps] == [("approved", "ok")]


async def test_a_rejected_call_returns_an_error_with_the_reason(gateway: Gateway) -> None:
    _, approver = gateway.create_key(scopes=["approver"])
    decided: list[Any] = []
    human = threading.Thread(target=reject_when_pending, args=(gateway, approver, "files__delete_file", decided))
    human.start()
    async with mcp_session(gateway) as session:
        result = await session.call_tool("files__delete_file", {"path": "/tmp/keep.log"})
    await asyncio.to_thread(human.join, 30)
    assert result.is_error
    assert text_of(result) == "The call to 'files__delete_file' was not approved (rejected: not today)."


async def test_an_approval_nobody_gives_expires_with_the_policys_wait(gateway: Gateway) -> None:
    _, hasty = gateway.create_key(tenant="hastyco")
    async with mcp_session(gateway, hasty) as session:
        result = await session.call_tool("files__delete_file", {"path": "/tmp/x"})
    assert result.is_error
    assert "not approved (expired" in text_of(result)


def test_an_unauthenticated_agent_gets_401_in_openai_shape(gateway: Gateway) -> None:
    reply = httpx.post(f"{gateway.url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, timeout=10)
    assert reply.status_code == 401
    assert reply.json()["error"]["code"] == "invalid_api_key"


def _stdio_server_pid(gateway_pid: int) -> int:
    """The gateway's child running the stdio MCP server (found in /proc, bounded)."""
    for _ in range(200):
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if int(stat[1]) == gateway_pid and b"mcp_upstream --stdio" in cmdline:
                return int(entry.name)
        threading.Event().wait(0.05)
    raise AssertionError("no stdio MCP server under the gateway")


def _bytes_read(pid: int) -> int:
    """What the process has read so far, its stdin included (the kernel's count)."""
    fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(fields["rchar"])


async def test_a_stdio_server_killed_mid_call_gives_a_clear_error_and_is_restarted(gateway: Gateway) -> None:
    victim = _stdio_server_pid(os.getpid())  # the gateway runs in this process
    async with mcp_session(gateway) as session:
        read_before = _bytes_read(victim)
        call = asyncio.ensure_future(session.call_tool("local__slow_echo", {"text": "hi", "seconds": 20}))
        # The call is in the server's hands once it has read it from its stdin (it then sleeps 20 s).
        # A ping the gateway sends meanwhile is about 45 bytes; the call's JSON-RPC line over 100.
        deadline = time.monotonic() + 15
        while _bytes_read(victim) - read_before < 100:
            assert time.monotonic() < deadline, "the stdio server never read the call"
            await asyncio.sleep(0.01)
        os.kill(victim, signal.SIGKILL)
        result = await asyncio.wait_for(call, 15)
        assert result.is_error
        assert text_of(result) == "MCP server 'local' went away during the call"
        after = await session.call_tool("local__read_file", {"path": "/srv/b"})
    assert not after.is_error
    assert text_of(after) == "contents of /srv/b"
    assert _stdio_server_pid(os.getpid()) != victim
    statuses = [r["status"] for r in audit_where(gateway, lambda r: r["server"] == "local", count=2)]
    assert "upstream_unavailable" in statuses


def test_audit_verify_passes_after_the_mcp_calls(gateway: Gateway) -> None:
    verify = subprocess.run(
        ["gateway", "audit", "verify", "--config", str(gateway.config_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr


async def test_a_server_slower_than_its_call_timeout_gives_a_clear_error(gateway: Gateway) -> None:
    async with mcp_session(gateway) as session:
        result = await session.call_tool("hasty__slow_echo", {"text": "hi", "seconds": 5})
    assert result.is_error
    assert text_of(result) == "MCP server 'hasty' did not answer within 1s"


async def test_a_result_over_the_size_limit_is_refused(gateway: Gateway) -> None:
    async with mcp_session(gateway) as session:
        small = await session.call_tool("files__big", {"size": 100})
        large = await session.call_tool("files__big", {"size": 5000})
    assert text_of(small) == "x" * 100
    assert large.is_error
    assert text_of(large).startswith("The result of 'big' is too large (")
    assert text_of(large).endswith("bytes; the limit is 4096).")


async def test_resources_and_prompts_are_not_exposed(gateway: Gateway) -> None:
    async with mcp_session(gateway) as session:
        capabilities = (await session.initialize()).capabilities
        assert capabilities.tools is not None
        assert capabilities.resources is None
        assert capabilities.prompts is None
        with pytest.raises(MCPError):
            await session.list_resources()


async def test_metrics_count_calls_per_server_and_outcome(gateway: Gateway) -> None:
    async with mcp_session(gateway) as session:
        denied = await session.call_tool("files__shutdown", {})  # not on the whitelist
    assert denied.is_error
    text = (await asyncio.to_thread(httpx.get, f"{gateway.url}/metrics", timeout=10)).text
    assert 'gateway_mcp_server_up{server="files"} 1.0' in text
    assert 'gateway_mcp_calls_total{server="files",status="denied"}' in text


def test_a_chat_call_to_a_gateway_run_tool_that_breaks_its_rules_is_still_denied(gateway: Gateway) -> None:
    """Only the approval moves to execution for tools the gateway runs: a call the policy denies
    (here the path rule) is blocked in chat like any other."""
    parameters = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
    body = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": "clean up"}],
        "tools": [{"type": "function", "function": {"name": "files__delete_file", "parameters": parameters}}],
        "tool_choice": {"type": "function", "function": {"name": "files__delete_file"}},
    }
    reply = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=gateway.headers(), timeout=30)
    message = reply.json()["choices"][0]["message"]
    assert not message.get("tool_calls")
    assert "The gateway blocked a call to 'files__delete_file'" in message["content"]


async def test_a_held_call_the_agent_abandons_is_still_audited(gateway: Gateway) -> None:
    _, approver = gateway.create_key(scopes=["approver"])
    async with mcp_session(gateway) as session:
        call = asyncio.ensure_future(session.call_tool("files__delete_file", {"path": "/tmp/abandoned.log"}))
        approval_id = await asyncio.to_thread(pending_approval, gateway, approver, "/tmp/abandoned.log")
        call.cancel()  # the agent gives up while a person has not decided yet
    records = await asyncio.to_thread(audit_where, gateway, lambda r: r.get("approval_id") == approval_id)
    assert [(r["tool"], r["status"]) for r in records] == [("files__delete_file", "cancelled")]
    # Nobody waits for the decision any more: it cannot be approved later, nor collected through chat.
    url = f"{gateway.url}/admin/approvals/{approval_id}"
    async with httpx.AsyncClient(timeout=30) as http:
        assert (await http.get(url, headers=gateway.headers(approver))).json()["status"] == "expired"
        assert (await http.post(f"{url}/approve", headers=gateway.headers(approver))).status_code == 409
        collect = await http.post(
            f"{gateway.url}/v1/chat/completions",
            json={"model": "sim-model", "messages": [{"role": "user", "content": "go"}]},
            headers={**gateway.headers(), "X-Approval-Id": approval_id},
        )
    assert collect.status_code == 404


def pending_approval(gateway: Gateway, approver: str, path: str) -> str:
    client = httpx.Client(base_url=f"{gateway.url}/admin", headers=gateway.headers(approver), timeout=10)
    for _ in range(600):  # 30 s at most
        listed = client.get("/approvals", params={"status": "pending"}).json()["data"]
        found = [a["id"] for a in listed if path in a["arguments"]]
        if found:
            return str(found[0])
        threading.Event().wait(0.05)
    raise AssertionError("the call was never held")


async def test_mcp_calls_are_metered_like_any_request(gateway: Gateway) -> None:
    """A key's RPM counts its tool calls too, denied ones included (probing costs)."""
    key_id, key = gateway.create_key(rpm=3)
    async with mcp_session(gateway, key) as session:
        results = [await session.call_tool("files__read_file", {"path": f"/srv/{n}"}) for n in range(2)]
        results.append(await session.call_tool("files__shutdown", {}))
        refused = await session.call_tool("files__read_file", {"path": "/srv/3"})
    assert [r.is_error for r in results] == [False, False, True]
    assert refused.is_error
    assert text_of(refused).startswith("Rate limit reached")
    records = await asyncio.to_thread(audit_where, gateway, lambda r: r["key_id"] == key_id, 4)
    statuses = [r["status"] for r in records]
    assert statuses == ["ok", "ok", "denied", "rate_limited"]
