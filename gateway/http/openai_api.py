"""`/v1/chat/completions` and `/v1/models`, and the answering of any surface's request.

`answer` hands a context naming the request's surface to the pipeline and waits for the first
chunk before choosing the response: an error before any output is a proper HTTP error status (in
the surface's error shape), after it an in-band error event followed by the surface's terminal
event (`[DONE]`), never a silently truncated 200.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Sequence

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import Scope as AsgiScope

from gateway.auth.stage import Authenticator
from gateway.auth.tenancy import ModelTenancy
from gateway.core.answer import Answer
from gateway.core.chunks import Chunk
from gateway.core.error_bodies import error_json
from gateway.core.principal import Scope
from gateway.core.surface import Surface
from gateway.errors import GatewayError
from gateway.http.requests import read_body
from gateway.http.streamed_response import StreamedResponse
from gateway.ids import RandomIds, request_id_from
from gateway.pipeline import Handler, RequestContext
from gateway.sessions.manager import SessionManager
from gateway.settings import ServerSettings
from gateway.stream_events import StreamEvents, answer_head
from gateway.surfaces.chat_completions import CHAT_COMPLETIONS, ChatCompletions
from gateway.wire import dumps

log = logging.getLogger(__name__)

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def header_map(scope: AsgiScope) -> dict[str, str]:
    """The request's headers as a dict by name (which ASGI servers send in lower case). The stages
    look up about ten a request: a hash each, not Starlette's scan that decodes header after
    header. The first of a repeated header wins, as with Starlette's `Headers.get`."""
    headers: dict[str, str] = {}
    for name, value in scope["headers"]:
        headers.setdefault(name.decode("latin-1"), value.decode("latin-1"))
    return headers


class OpenAIApi:
    def __init__(
        self,
        pipeline: Handler,
        authenticator: Authenticator,
        sessions: SessionManager | None,
        tenancy: ModelTenancy,
        server: ServerSettings,
        chat: ChatCompletions,
        others: Sequence[Surface] = (),
    ) -> None:
        """`others`: the surfaces besides chat completions, each served on its own path."""
        self.pipeline = pipeline
        self._authenticator = authenticator
        self._sessions = sessions
        self._tenancy = tenancy
        self._server = server
        self._ids = RandomIds()
        self.chat = chat
        self._others = tuple(others)

    def routes(self) -> list[BaseRoute]:
        return [
            Route(CHAT_COMPLETIONS, self.chat_completions, methods=["POST"]),
            *(
                Route(surface.path, functools.partial(self.answer_in_its_shape, surface=surface), methods=["POST"])
                for surface in self._others
            ),
            Route("/v1/models", self.list_models, methods=["GET"]),
        ]

    async def chat_completions(self, request: Request) -> Response:
        return await self.answer(request, self.chat)

    async def answer_in_its_shape(self, request: Request, surface: Surface) -> Response:
        """`answer`, with an error before the first chunk in the surface's shape and status (an
        Anthropic client parses Anthropic's); chat's errors go to the app's handlers instead."""
        try:
            return await self.answer(request, surface)
        except GatewayError as error:
            return surface_error_response(surface, error)

    async def answer(self, request: Request, surface: Surface) -> Response:
        """One request of `surface`'s through the pipeline: a GatewayError before the answer's
        first chunk is raised, for the caller to render in the surface's error shape."""
        headers = header_map(request.scope)
        ctx = RequestContext(
            request_id=request_id_from(headers, self._ids),
            completion_id=f"{surface.id_prefix}{self._ids.hex()}",
            surface=surface,
            client=request.client.host if request.client else "",
            headers=headers,
            read_body=functools.partial(read_body, request, self._server.max_body_bytes, self._server.body_timeout_s),
        )
        chunks = self.pipeline(ctx)
        try:
            first = await anext(chunks, None)
        except GatewayError as error:
            await chunks.aclose()
            error.request_id = ctx.request_id  # named in a 5xx's message and header
            raise
        except BaseException:
            await chunks.aclose()
            raise
        sent = {"X-Request-Id": ctx.request_id, **ctx.response_headers}
        if not ctx.stream and ctx.approval_keepalive_s:
            body = _kept_alive(ctx, first, chunks, self._sessions, ctx.approval_keepalive_s)
            return StreamedResponse(body, media_type="application/json", headers=sent)
        if not ctx.stream:
            return await _collect(ctx, first, chunks, sent, self._sessions)
        if self._sessions is None or ctx.session_unresumable:
            frames = _sse_stream(ctx, first, chunks)  # nothing to checkpoint to: this connection only
        else:
            # The response is generated in its own task, so it survives this connection.
            live = await self._sessions.start(ctx, _rest(first, chunks))
            continuity = ctx.continuity
            if continuity is not None and continuity.background and not continuity.background_events:
                begun = ctx.surface.answer_of(live.log.events[0][1]) or {}  # the answer as it began
                return Response(dumps(begun), media_type="application/json", headers=sent)
            frames = self._sessions.frames(live, after_seq=0)
        return StreamedResponse(frames, media_type="text/event-stream", headers={**_SSE_HEADERS, **sent})

    async def list_models(self, request: Request) -> Response:
        principal = await self._authenticator.authenticate(request.headers)
        principal.require(Scope.CHAT)
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "agent-gateway"}
            for name in self._tenancy.names
            if self._tenancy.may_use(principal, name)
        ]
        return Response(dumps({"object": "list", "data": data}), media_type="application/json")


async def _rest(first: Chunk | None, chunks: AsyncGenerator[Chunk, None]) -> AsyncGenerator[Chunk, None]:
    async with contextlib.aclosing(chunks):
        if first is not None:
            yield first
        async for chunk in chunks:
            yield chunk


async def _sse_stream(
    ctx: RequestContext, first: Chunk | None, chunks: AsyncGenerator[Chunk, None]
) -> AsyncIterator[bytes]:
    events = StreamEvents(ctx)
    frame = ctx.surface.frame
    # Closed on every exit: a client gone mid-stream ends the stages (and their releases) now.
    async with contextlib.aclosing(events.payloads(_rest(first, chunks))) as payloads:
        async for payload in payloads:
            yield frame(None, payload)
    if events.failure is not None:
        for payload in events.failure_payloads():
            yield frame(None, payload)
    if ctx.surface.done is not None:
        yield frame(None, ctx.surface.done)


async def _collected(
    ctx: RequestContext, first: Chunk | None, chunks: AsyncGenerator[Chunk, None], sessions: SessionManager | None
) -> bytes:
    """The surface's body of the whole answer; a GatewayError before it is complete propagates."""
    answer = Answer()
    async with contextlib.aclosing(chunks):
        async for chunk in _rest(first, chunks):
            answer.add(chunk)
    body = ctx.surface.collected(answer_head(ctx), answer, ctx.usage)
    if sessions is not None:
        await sessions.remember(ctx, answer.message(), body)
    return dumps(body)


def surface_error_response(surface: Surface, error: GatewayError) -> Response:
    """`error` in `surface`'s shape, named by its request when it has one."""
    headers = error.headers()
    if error.request_id is not None:
        headers = {**headers, "X-Request-Id": error.request_id}
    return error_json(surface.error_status(error), surface.error_body(error), headers)


async def _collect(
    ctx: RequestContext,
    first: Chunk | None,
    chunks: AsyncGenerator[Chunk, None],
    headers: dict[str, str],
    sessions: SessionManager | None,
) -> Response:
    try:
        body = await _collected(ctx, first, chunks, sessions)
    except GatewayError as error:
        error.request_id = ctx.request_id
        return surface_error_response(ctx.surface, error)
    # Headers decided while the answer was generated (X-Approval-Id) are known only now.
    return Response(body, media_type="application/json", headers={**headers, **ctx.response_headers})


async def _kept_alive(
    ctx: RequestContext,
    first: Chunk | None,
    chunks: AsyncGenerator[Chunk, None],
    sessions: SessionManager | None,
    every_s: float,
) -> AsyncIterator[bytes]:
    """A non-streamed answer held for a person's decision: the status and headers went out
    already; a space every `every_s` (JSON allows leading whitespace) keeps proxies with idle
    timeouts from cutting the connection until the JSON follows. An error after that point can
    only be the body: the status is already 200."""
    collecting = asyncio.ensure_future(_collected(ctx, first, chunks, sessions))
    try:
        while not collecting.done():
            await asyncio.wait({collecting}, timeout=every_s)
            if not collecting.done():
                yield b" "
        try:
            yield collecting.result()
        except GatewayError as error:
            error.request_id = ctx.request_id
            yield dumps(ctx.surface.error_body(error))
    finally:
        if not collecting.done():
            collecting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await collecting
