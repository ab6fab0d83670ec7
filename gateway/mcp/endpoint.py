"""The gateway's MCP endpoint: the Streamable HTTP transport of the official SDK, behind the
gateway's own API keys.

The endpoint is stateless (each POST carries one JSON-RPC request and gets its answer, streamed
as SSE when the call sends progress first), so any replica can serve any agent and no MCP
session state needs sharing. The key is checked before the SDK sees the request; the principal
rides in the ASGI scope's state to the handlers, which read it from the SDK's request context.
Resources and prompts are not exposed: the server declares the tools capability only.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.types import Receive, Scope, Send

from gateway.auth.stage import Authenticator
from gateway.core.error_bodies import gateway_error_response
from gateway.core.principal import Principal
from gateway.core.principal import Scope as KeyScope
from gateway.errors import GatewayError, MethodNotAllowed
from gateway.mcp.service import McpGateway

log = logging.getLogger(__name__)
_PRINCIPAL = "agent_gateway_principal"


class McpEndpoint:
    """An ASGI app: authenticate, then hand the request to the SDK's session manager."""

    def __init__(self, gateway: McpGateway, authenticator: Authenticator, max_body_bytes: int) -> None:
        self._gateway = gateway
        self._authenticator = authenticator
        server: Server[Any] = Server(
            "agent-gateway",
            instructions="Tools of the servers behind this gateway, as your key's tool policy allows.",
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )
        self._manager = StreamableHTTPSessionManager(server, stateless=True, max_request_body_size=max_body_bytes)

    @property
    def gateway(self) -> McpGateway:
        return self._gateway

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Upstream supervisors and the SDK's session manager, for the app's lifetime."""
        self._gateway.start()
        try:
            async with self._manager.run():
                yield
        finally:
            await self._gateway.stop()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            principal = await self._authenticator.authenticate(headers)
            principal.require(KeyScope.CHAT)
            if scope["method"] == "GET":
                # The standalone SSE stream carries server-initiated messages, which a stateless
                # endpoint never sends; held open it would count against no lease and no audit.
                # The specification allows 405 here, and the SDK's client takes it as "none".
                raise MethodNotAllowed("This MCP endpoint is stateless: it offers no GET stream.", allow="POST")
        except GatewayError as error:
            await gateway_error_response(error)(scope, receive, send)
            return
        scope.setdefault("state", {})[_PRINCIPAL] = principal
        await self._manager.handle_request(scope, receive, send)

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], _: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self._gateway.visible_tools(_principal(ctx)))

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        async def progress(done: float, message: str) -> None:
            await ctx.session.report_progress(done, None, message)

        return await self._gateway.call(_principal(ctx), params.name, dict(params.arguments or {}), progress)


def _principal(ctx: ServerRequestContext[Any]) -> Principal:
    request = ctx.request
    principal = request.scope.get("state", {}).get(_PRINCIPAL) if request is not None else None
    if not isinstance(principal, Principal):
        # Only reachable if the SDK stopped attaching the HTTP request: fail closed.
        raise PermissionError("no authenticated principal on this MCP request")
    return principal
