"""The official SDK's client against the gateway's MCP endpoint, as an agent would use it."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import httpx2
import mcp_types as types
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from testkit.procs import Gateway


@contextlib.asynccontextmanager
async def mcp_session(gateway: Gateway, key: str | None = None) -> AsyncIterator[ClientSession]:
    headers = gateway.headers(key)
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(10, read=60)) as http,
        streamable_http_client(f"{gateway.url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


def wait_for_mcp_servers(gateway: Gateway, timeout_s: float = 60) -> dict[str, Any]:
    """Readiness as an operator sees it, once every MCP server is up (bounded)."""
    deadline = time.monotonic() + timeout_s
    while True:
        body = httpx.get(f"{gateway.url}/readyz", timeout=10).json()
        if all(state == "up" for state in body["mcp_servers"].values()) or time.monotonic() > deadline:
            return dict(body)
        time.sleep(0.05)
