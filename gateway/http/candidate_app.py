"""The candidate release's traffic: the gateway's own request path as an app, pinned to one release.

The preflight's eval cases are sent, in process, through the same stages as a client's request,
with two differences that `app.py` makes when it builds the path for an operator: the promoting
operator stands in for the key (`ActAs`; no secret crosses any socket), and quota admission is left
out (preflight traffic is no tenant's). The `X-Gateway-Release` header then pins the candidate, as
it does for an admin key over HTTP. The replay smoke run measures timings over real HTTP from a
child process, so it gets the same app on a one-time local listener (candidate_listener.py).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import httpx
from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.auth.stage import Authenticator
from gateway.auth.tenancy import ModelTenancy
from gateway.core.principal import Principal
from gateway.http.candidate_listener import serve_once
from gateway.http.errors import install_error_handlers
from gateway.http.openai_api import OpenAIApi
from gateway.pipeline import Handler
from gateway.releases.candidate import RELEASE_HEADER, Listener
from gateway.settings import ServerSettings
from gateway.surfaces.chat_completions import ChatCompletions


class CandidateApp:
    """Implements releases' CandidateTraffic; `path_for(actor)` is the request path run as `actor`."""

    def __init__(
        self,
        path_for: Callable[[Principal], Handler],
        authenticator: Authenticator,
        tenancy: ModelTenancy,
        server: ServerSettings,
    ) -> None:
        self._path_for = path_for
        self._authenticator = authenticator
        self._tenancy = tenancy
        self._server = server

    def transport(self, actor: Principal, version: str) -> httpx.AsyncBaseTransport:
        return httpx.ASGITransport(app=self.app(actor, version))

    def listener(self, actor: Principal, version: str) -> AbstractAsyncContextManager[Listener]:
        return serve_once(self.app(actor, version))

    def app(self, actor: Principal, version: str) -> ASGIApp:
        """The request path as an ASGI app, pinned to `version`, `actor` as the caller."""
        api = OpenAIApi(
            self._path_for(actor), self._authenticator, None, self._tenancy, self._server, ChatCompletions()
        )
        app = Starlette(routes=api.routes())
        install_error_handlers(app)  # type: ignore[arg-type]  # only the Starlette part is used
        pin = (RELEASE_HEADER.encode(), version.encode())

        async def pinned(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                headers = [h for h in scope["headers"] if h[0].lower() != pin[0]]
                scope = {**scope, "headers": [*headers, pin]}
            await app(scope, receive, send)

        return pinned
