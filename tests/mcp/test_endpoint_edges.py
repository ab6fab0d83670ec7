"""The MCP endpoint at its edges: arguments JSON cannot carry through, and the standalone GET stream
a stateless endpoint does not offer (issue 29, items 4 and 5)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson

from testkit.procs import Gateway
from tests.mcp.test_endpoint import audit_where

MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def call_tool_raw(gateway: Gateway, key: str, arguments_json: str) -> dict[str, Any]:
    """A `tools/call` as raw JSON-RPC, so the arguments are exactly the bytes given (the SDK's client
    would encode them itself); the stateless endpoint needs no `initialize` first."""
    body = '{"jsonrpc": "2.0", "id": 7, "method": "tools/call", '
    body += '"params": {"name": "files__read_file", "arguments": ' + arguments_json + "}}"
    reply = httpx.post(f"{gateway.url}/mcp", content=body, headers={**gateway.headers(key), **MCP_HEADERS}, timeout=30)
    assert reply.status_code == 200, reply.text
    if reply.headers["content-type"].startswith("text/event-stream"):
        data = [line[len("data:") :] for line in reply.text.splitlines() if line.startswith("data:")]
        messages = [orjson.loads(d) for d in data]
        return next(m for m in messages if m.get("id") == 7)
    return dict(reply.json())


async def test_arguments_json_cannot_encode_are_one_audited_charged_refusal_in_the_gateways_words(
    gateway: Gateway,
) -> None:
    key_id, key = gateway.create_key(rpm=2)
    too_big = str(2**64)  # valid JSON; orjson (and so the audit digest) refuses integers past 64 bits
    answers = [call_tool_raw(gateway, key, '{"path": ' + too_big + "}") for _ in range(2)]
    for answer in answers:
        result = answer["result"]
        assert result["isError"] is True
        text = result["content"][0]["text"]
        assert "64-bit" in text
        assert "files__read_file" in text
        assert "orjson" not in text.lower()
        assert "Integer exceeds" not in text  # orjson's own message
    # Both calls were charged: the third is over the key's RPM.
    third = call_tool_raw(gateway, key, '{"path": "/srv/ok"}')["result"]
    assert third["isError"] is True
    assert third["content"][0]["text"].startswith("Rate limit reached")
    records = await asyncio.to_thread(audit_where, gateway, lambda r: r["key_id"] == key_id, 3)
    assert [r["status"] for r in records] == ["invalid_arguments", "invalid_arguments", "rate_limited"]
    assert all(r["tool"] == "files__read_file" for r in records)
    assert records[0]["arguments_sha256"] is None  # nothing canonical to digest


def test_a_standalone_get_stream_is_refused_with_405_in_stateless_mode(gateway: Gateway) -> None:
    """Held-open GET streams were neither leased nor audited: the stateless endpoint does not offer them."""
    _, key = gateway.create_key(max_concurrency=1, rpm=5)
    headers = {**gateway.headers(key), "Accept": "text/event-stream"}
    for _ in range(8):  # more than the key's RPM and concurrency: each is answered at once, none held
        with httpx.stream("GET", f"{gateway.url}/mcp", headers=headers, timeout=10) as reply:
            assert reply.status_code == 405
            assert reply.headers["allow"] == "POST"
            body = orjson.loads(reply.read())
            assert body["error"]["code"] == "method_not_allowed"
    # The key is untouched by them: a tool call still goes through.
    ok = call_tool_raw(gateway, key, '{"path": "/srv/ok"}')["result"]
    assert ok["isError"] is False


def test_an_unauthenticated_get_still_gets_401(gateway: Gateway) -> None:
    reply = httpx.get(f"{gateway.url}/mcp", headers={"Accept": "text/event-stream"}, timeout=10)
    assert reply.status_code == 401
