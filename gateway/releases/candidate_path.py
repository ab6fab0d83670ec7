"""Preflight traffic through the gateway's own request path, pinned to the candidate release.

The eval gate must see what users will get: the release's system prompt, its deployments and the
tool policy. So the eval cases are sent, in process, through the same stages as a client's request
(`app.py`'s list), with two differences: the promoting operator stands in for the key (no secret
crosses any socket), and quota admission is left out (preflight traffic is no tenant's). The
`X-Gateway-Release` header then pins the candidate, as it does for an admin key over HTTP.

The replay smoke run measures timings over real HTTP from a child process, so it gets the same app
on a one-time local listener instead (candidate_listener.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Sequence

import httpx
from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.auth.principal import Principal
from gateway.auth.stage import Authenticate, Authenticator
from gateway.auth.tenancy import ModelTenancy
from gateway.core.chunks import Chunk
from gateway.http.errors import install_error_handlers
from gateway.http.openai_api import OpenAIApi
from gateway.pipeline import Handler, RequestContext, Stage, compose
from gateway.quota.stage import Admit
from gateway.settings import ServerSettings

RELEASE_HEADER = "x-gateway-release"
# The base URL eval runners are given; the transport never opens a socket, the host is a label.
BASE_URL = "http://gateway.preflight/v1"


class _AsActor:
    """Stands in for `Authenticate`: the operator who asked for the preflight is the caller."""

    def __init__(self, principal: Principal) -> None:
        self._principal = principal

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> AsyncGenerator[Chunk, None]:
        ctx.principal = self._principal
        async with contextlib.aclosing(call_next(ctx)) as chunks:
            async for chunk in chunks:
                yield chunk


class CandidatePath:
    """Builds, per preflight, an httpx transport into the request path pinned to one release."""

    def __init__(
        self,
        stages: Sequence[Stage],
        terminal: Handler,
        authenticator: Authenticator,
        tenancy: ModelTenancy,
        server: ServerSettings,
    ) -> None:
        self._stages = list(stages)
        self._terminal = terminal
        self._authenticator = authenticator
        self._tenancy = tenancy
        self._server = server

    def transport(self, actor: Principal, version: str) -> httpx.AsyncBaseTransport:
        """In process: the eval cases need whole responses only (httpx buffers them)."""
        return httpx.ASGITransport(app=self.app(actor, version))

    def app(self, actor: Principal, version: str) -> ASGIApp:
        """The request path as an ASGI app, pinned to `version`, `actor` as the caller."""
        kept = [s for s in self._stages if not isinstance(s, Admit)]
        stages = [_AsActor(actor) if isinstance(s, Authenticate) else s for s in kept]
        api = OpenAIApi(compose(stages, self._terminal), self._authenticator, None, self._tenancy, self._server)
        app = Starlette(routes=api.routes())
        install_error_handlers(app)  # type: ignore[arg-type]  # only the Starlette part is used
        pin = (RELEASE_HEADER.encode(), version.encode())

        async def pinned(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                headers = [h for h in scope["headers"] if h[0].lower() != pin[0]]
                scope = {**scope, "headers": [*headers, pin]}
            await app(scope, receive, send)

        return pinned
