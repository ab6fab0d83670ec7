"""One upstream MCP server: a supervised connection, its tool list, and calls with a deadline.

The gateway holds one MCP session per upstream server and multiplexes every agent's calls over
it (JSON-RPC ids keep them apart). A supervisor task owns the session: it connects (starting the
process, for a stdio server), lists the tools, then pings it; when the connection breaks (the
process died, the server stopped answering) it reconnects with exponential backoff. Calls made
while the server is down wait for it, bounded by the call's deadline, so a call made a moment
after a crash succeeds once the supervisor has restarted the server.

Every foreign error of the SDK and its transports is translated here into `UpstreamUnavailable`
or `UpstreamCallFailed`; nothing above this module sees an `mcp` or `anyio` exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx2
import mcp_types as types
from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from gateway.mcp.status import UpstreamState, UpstreamStatus
from gateway.settings import McpServerSettings

log = logging.getLogger(__name__)

_PING_INTERVAL_S = 2.0
_MAX_BACKOFF_S = 30.0
# What a broken connection looks like from the SDK: its own "connection closed" error, the
# memory streams between the session and the transport, the transport's sockets and pipes.
_BROKEN = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError, httpx2.HTTPError)


class UpstreamUnavailable(Exception):
    """The server could not be reached (down, restarting, or too slow) within the call's deadline."""


class UpstreamCallFailed(Exception):
    """The server answered the call with a protocol error (not a tool error, which is a result)."""


class UpstreamServer:
    def __init__(self, settings: McpServerSettings) -> None:
        self.settings = settings
        self.name = settings.name
        self.tools: list[types.Tool] = []
        self._session: ClientSession | None = None
        self._up = asyncio.Event()
        self._broken = asyncio.Event()
        self._state = UpstreamState.STARTING
        self._restarts = 0
        self._last_error = ""

    def status(self) -> UpstreamStatus:
        return UpstreamStatus(self.name, self._state, len(self.tools), self._restarts, self._last_error)

    async def call(
        self, tool: str, arguments: dict[str, Any], meta: types.RequestParamsMeta | None
    ) -> types.CallToolResult:
        """Call `tool`; waits for the server while it (re)starts, all within `call_timeout_s`."""
        deadline = self.settings.call_timeout_s
        session: ClientSession | None = None
        try:
            async with asyncio.timeout(deadline):
                await self._up.wait()
                session = self._session
                assert session is not None
                return await session.call_tool(tool, arguments, meta=meta)
        except TimeoutError:
            raise UpstreamUnavailable(f"MCP server '{self.name}' did not answer within {deadline:g}s") from None
        except MCPError as error:
            if error.code != types.CONNECTION_CLOSED:
                raise UpstreamCallFailed(f"MCP server '{self.name}' refused the call: {error.message}") from None
            # Over HTTP, one request that ended without an answer is reported this way too: only a
            # stdio pipe that closed means the whole connection is gone (pings find the rest).
            if self.settings.command is not None:
                self._mark_broken(session, f"connection closed: {error.message}")
            raise UpstreamUnavailable(f"MCP server '{self.name}' went away during the call") from None
        except _BROKEN as error:
            self._mark_broken(session, repr(error))
            raise UpstreamUnavailable(f"MCP server '{self.name}' went away during the call") from None
        except Exception as error:  # noqa: BLE001 - the SDK's checks of an answer (bad structured output, ...)
            log.warning("MCP server %r gave an unusable answer to %s: %r", self.name, tool, error)
            raise UpstreamCallFailed(f"MCP server '{self.name}' gave an unusable answer") from None

    async def run(self) -> None:
        """The supervisor: keep a session up until cancelled."""
        backoff = self.settings.restart_backoff_s
        while True:
            started = time.monotonic()
            try:
                await self._serve_one_session()
            except Exception as error:  # noqa: BLE001 - whatever ended the session, it is logged and restarted
                self._last_error = _describe(error)
            # anyio's task groups may report a cancellation as the group of what else failed.
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise asyncio.CancelledError
            self._went_down()
            if time.monotonic() - started > 2 * _MAX_BACKOFF_S:
                backoff = self.settings.restart_backoff_s  # it had been up a while: start over
            log.warning("MCP server %r is down (%s); restarting in %.1fs", self.name, self._last_error, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _MAX_BACKOFF_S)
            self._restarts += 1

    async def _serve_one_session(self) -> None:
        async with self._connect() as session:
            async with asyncio.timeout(self.settings.connect_timeout_s):
                await session.initialize()
                self.tools = await _all_tools(session)
            self._session, self._state, self._last_error = session, UpstreamState.UP, ""
            self._broken.clear()
            self._up.set()
            log.info("MCP server %r is up with %d tools", self.name, len(self.tools))
            await self._watch(session)

    async def _watch(self, session: ClientSession) -> None:
        """Return when the connection is known to be broken: a failed call said so, or a ping failed."""
        while not self._broken.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_PING_INTERVAL_S):
                    await self._broken.wait()
                    return
            async with asyncio.timeout(self.settings.connect_timeout_s):
                await session.send_ping()

    @contextlib.asynccontextmanager
    async def _connect(self) -> AsyncIterator[ClientSession]:
        settings = self.settings
        async with contextlib.AsyncExitStack() as stack:
            if settings.url is not None:
                timeout = httpx2.Timeout(settings.connect_timeout_s, read=settings.call_timeout_s + 5)
                client = await stack.enter_async_context(httpx2.AsyncClient(headers=settings.headers, timeout=timeout))
                read, write = await stack.enter_async_context(streamable_http_client(settings.url, http_client=client))
            else:
                assert settings.command is not None
                command, *args = settings.command
                parameters = StdioServerParameters(command=command, args=args, env=settings.env or None)
                read, write = await stack.enter_async_context(stdio_client(parameters))
            yield await stack.enter_async_context(ClientSession(read, write))

    def _mark_broken(self, session: ClientSession | None, reason: str) -> None:
        if session is None or session is not self._session:
            return  # an error of a session already replaced says nothing about the current one
        self._last_error = reason
        self._up.clear()
        self._broken.set()

    def _went_down(self) -> None:
        self._session = None
        self._state = UpstreamState.DOWN
        self._up.clear()


async def _all_tools(session: ClientSession) -> list[types.Tool]:
    tools: list[types.Tool] = []
    cursor: str | None = None
    for _ in range(100):  # a server that pages forever is cut off
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:300]
