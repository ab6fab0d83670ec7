"""The session stages of the request path: `AssignSession`, `AppendHistory` and `ClaimSession`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncGenerator, Mapping
from typing import Any

from gateway.core.chunks import Chunk
from gateway.core.principal import Principal
from gateway.core.surface import Continuity
from gateway.errors import Conflict, InvalidRequest, NotFound, StoreUnavailable
from gateway.ids import RandomIds
from gateway.pipeline import Handler, RequestContext
from gateway.sessions.live import TAIL_POLL_S, may_open
from gateway.sessions.manager import SessionManager
from gateway.settings import SessionSettings, SessionStoreFailMode
from gateway.store.base import SessionStore
from gateway.store.session_record import SessionState

# The name sessions logged under as one module, gateway/sessions.py: operators filter by it.
log = logging.getLogger("gateway.sessions")

SESSION_HEADER = "x-session-id"
APPEND_HEADER = "x-session-append"
RESUMABLE_HEADER = "X-Session-Resumable"  # "false": answered without a checkpoint (store down)
SHARE_HEADER = "x-session-share"  # "tenant": every key of the tenant may use it; "key" (default): its key only
_VALID_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def session_id_from(headers: Mapping[str, str], ids: RandomIds) -> str:
    given = headers.get(SESSION_HEADER)
    if given is None:
        return f"sess_{ids.hex(12)}"
    if not _VALID_ID.match(given):
        raise InvalidRequest("X-Session-Id must be 1-128 characters of A-Z a-z 0-9 . _ : -", param="X-Session-Id")
    return given


def _share_from(headers: Mapping[str, str]) -> bool | None:
    given = headers.get(SHARE_HEADER)
    if given is None:
        return None
    if given not in ("tenant", "key"):
        raise InvalidRequest("X-Session-Share must be 'tenant' or 'key'", param="X-Session-Share")
    return given == "tenant"


class AssignSession:
    """The pipeline stage that names the session (from X-Session-Id, or a new id) and decides
    whether its transcript is kept: only when the client names a session (X-Session-Id,
    X-Session-Append) or the settings list the request's tenant or key."""

    def __init__(self, settings: SessionSettings) -> None:
        self._tenants = frozenset(settings.transcript_tenants)
        self._keys = frozenset(settings.transcript_keys)
        self._ids = RandomIds()

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> AsyncGenerator[Chunk, None]:
        if ctx.surface.answer_sessions:
            if SESSION_HEADER in ctx.headers:
                raise InvalidRequest(
                    "On this API every response is a session of its own, named by its id: continue one "
                    "with 'previous_response_id' instead of X-Session-Id",
                    param="X-Session-Id",
                )
            ctx.session_id, ctx.session_new = ctx.completion_id, True
        else:
            ctx.session_id = session_id_from(ctx.headers, self._ids)
            ctx.session_new = SESSION_HEADER not in ctx.headers
        ctx.session_shared = bool(_share_from(ctx.headers))
        principal = ctx.principal
        ctx.keep_transcript = (
            SESSION_HEADER in ctx.headers
            or ctx.headers.get(APPEND_HEADER, "").lower() == "true"
            or (principal is not None and (principal.tenant in self._tenants or principal.key_id in self._keys))
        )
        ctx.response_headers["X-Session-Id"] = ctx.session_id
        async with contextlib.aclosing(call_next(ctx)) as chunks:
            async for chunk in chunks:
                yield chunk


class ClaimSession:
    """The pipeline stage, just before the call, that makes a streamed response's replica the
    session's owner before anything is asked of a backend (see `SessionManager.claim`)."""

    def __init__(self, sessions: SessionManager) -> None:
        self._sessions = sessions

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> AsyncGenerator[Chunk, None]:
        if ctx.session_unresumable:
            # Nothing of this answer is written to the session; once the store is back, a resume of
            # the session says why instead of replaying the answer before it.
            self._sessions.mark_unresumable(ctx)
            async with contextlib.aclosing(call_next(ctx)) as chunks:
                async for chunk in chunks:
                    yield chunk
            return
        live = await self._sessions.claim(ctx) if ctx.stream and ctx.principal is not None else None
        produced = False
        try:
            async with contextlib.aclosing(call_next(ctx)) as chunks:
                async for chunk in chunks:
                    produced = True
                    yield chunk
        finally:
            if live is not None and not produced:
                self._sessions.unclaim(live)


class AppendHistory:
    """Stateful conversations, opt-in with `X-Session-Append: true`: the client sends only its new
    messages, and the session's transcript is put in front of them. A request naming an existing
    session must be allowed to open it (`may_open`), appending or not: a new response replaces
    the session's stream, so it is a write.

    On a surface whose answers are kept as objects (`ctx.continuity`), a request continuing a kept
    answer gets that answer's conversation put after its own instructions, and an answer to be kept
    gets its conversation (without instructions) and input items made here, for the producer to
    store with it."""

    def __init__(self, store: SessionStore, settings: SessionSettings) -> None:
        self._store = store
        self._on_store_error = settings.on_store_error
        self._keeps_answers = settings.enabled  # the producer and its checkpoints keep them
        # A continued answer that just ended on another replica is in the store within a checkpoint.
        self._previous_patience_s = max(1.0, 5 * settings.checkpoint_interval_s)

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> AsyncGenerator[Chunk, None]:
        if ctx.continuity is not None and ctx.principal is not None:
            await self._continue(ctx, ctx.continuity, ctx.principal)
        append = ctx.headers.get(APPEND_HEADER, "").lower() == "true"
        if ctx.principal is not None and (append or SESSION_HEADER in ctx.headers):
            state = await self._load(ctx, append)
            if state is not None:
                if not may_open(ctx.principal, state):
                    raise NotFound(f"session '{ctx.session_id}' not found")
                owner = state.key_id
                ctx.session_owner = owner or None
                asked = _share_from(ctx.headers)
                # Only the owner changes who may use the session; anyone else keeps its setting.
                owns = owner == ctx.principal.key_id
                ctx.session_shared = bool(asked) if owns and asked is not None else state.shared
            if append:
                history = list(state.transcript or ()) if state else []
                ctx.body = {**ctx.body, "messages": [*history, *ctx.body["messages"]]}
        async with contextlib.aclosing(call_next(ctx)) as chunks:
            async for chunk in chunks:
                yield chunk

    async def _continue(self, ctx: RequestContext, continuity: Continuity, principal: Principal) -> None:
        history: tuple[dict[str, Any], ...] = ()
        history_items: tuple[dict[str, Any], ...] = ()
        if continuity.previous is not None:
            previous = await self._kept_answer(principal, continuity.previous)
            history = previous.transcript or ()
            history_items = (*(previous.input_items or ()), *ctx.surface.answer_items(previous.answer or {}))
        messages, setup = ctx.body["messages"], continuity.preamble
        if history:
            ctx.body = {**ctx.body, "messages": [*messages[:setup], *history, *messages[setup:]]}
        if continuity.background and not self._keeps_answers:
            raise InvalidRequest("Background responses need sessions, which this gateway has off", param="background")
        if not continuity.store:
            return
        if not self._keeps_answers:
            ctx.echo = {**ctx.echo, "store": False}  # sessions are off: the response says nothing is kept
            return
        ctx.conversation = (*history, *messages[setup:])
        ctx.kept_items = (*history_items, *continuity.items)

    async def _kept_answer(self, principal: Principal, answer_id: str) -> SessionState:
        """The kept answer `answer_id`, once it has ended; 404 unless the principal may open it."""
        deadline = time.monotonic() + self._previous_patience_s
        while True:
            state = await self._store.session_load(principal.tenant, answer_id)
            if state is None or not state.kept or not may_open(principal, state):
                raise NotFound(f"Previous response with id '{answer_id}' not found.", param="previous_response_id")
            if state.status != "streaming":
                return state
            if time.monotonic() >= deadline:
                raise Conflict(
                    f"Previous response '{answer_id}' is still in progress: continue it once it has ended",
                    param="previous_response_id",
                )
            await asyncio.sleep(TAIL_POLL_S)

    async def _load(self, ctx: RequestContext, append: bool) -> SessionState | None:
        """The session's state; with the store down, None for a request served unresumable."""
        assert ctx.principal is not None
        try:
            return await self._store.session_load(ctx.principal.tenant, ctx.session_id or "")
        except StoreUnavailable as error:
            if append or self._on_store_error is SessionStoreFailMode.CLOSED:
                raise  # an appending request's history is in the store: no honest answer without it
            log.warning("session %s answered without a checkpoint (store unavailable): %s", ctx.session_id, error)
            ctx.session_unresumable = True
            ctx.response_headers[RESUMABLE_HEADER] = "false"
            return None
