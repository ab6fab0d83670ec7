"""The producer: a streamed response runs in its own task and writes every SSE event to a `SessionLog`.

The HTTP response is only a reader of that log, so a client that drops its connection loses
nothing: generation goes on (or stops, per `on_client_disconnect`). Before the backend is asked
for anything the replica takes the session's lease and saves its state (`claim`), so no other
replica can take over a live stream however early a client reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncGenerator
from dataclasses import replace
from typing import Any

from gateway.core.chunks import Chunk
from gateway.core.surface import Surface
from gateway.errors import Conflict, GenerationCancelled, StoreUnavailable
from gateway.pipeline import RequestContext
from gateway.sessions.event_log import SessionLog
from gateway.sessions.live import TAIL_POLL_S, LiveSession, LiveSessions, state_of, ttl_of
from gateway.settings import SessionSettings
from gateway.store.base import SessionCheckpoint, SessionStore
from gateway.stream_events import StreamEvents

# The name sessions logged under as one module, gateway/sessions.py: operators filter by it.
log = logging.getLogger("gateway.sessions")

_CLAIM_PATIENCE_S = 0.5


class Producer:
    def __init__(self, store: SessionStore, settings: SessionSettings, replica_id: str, live: LiveSessions) -> None:
        self._store = store
        self._settings = settings
        self._replica_id = replica_id
        self._live = live
        self._background: set[asyncio.Task[None]] = set()

    async def start(self, ctx: RequestContext, chunks: AsyncGenerator[Chunk, None]) -> LiveSession:
        """Run `chunks` in a producer task that records every event; return once the first event
        exists. An error before it is raised here, so that it becomes an HTTP error status."""
        # The caller pulled the first chunk already, so authentication has run: the state is
        # complete before the producer starts (a fast stream may finish before `started()` returns).
        assert ctx.principal is not None
        key = (ctx.principal.tenant, ctx.session_id or "")
        live = self._live.by_key.get(key)
        if live is None or live.state.completion_id != ctx.completion_id or live.producer is not None:
            live = LiveSession(key[0], key[1], SessionLog(), state_of(ctx, self._replica_id), ctx.surface)
        live.detached = ctx.continuity is not None and ctx.continuity.background
        live.producer = asyncio.get_running_loop().create_task(self.produce(ctx, chunks, live))
        await live.log.started()
        if live.log.failure is not None:
            raise live.log.failure
        self._live.by_key[key] = live
        self._live.wakeup.set()
        return live

    async def claim(self, ctx: RequestContext) -> LiveSession:
        """Own the session before the first upstream byte: take its lease and save its state, so
        that a client reconnecting to another replica follows this one instead of taking over.
        Another live owner means the session is busy (409). With the store down the stream goes
        on unowned, and the first checkpoint claims the lease before it saves the state."""
        assert ctx.principal is not None
        state = state_of(ctx, self._replica_id)
        live = LiveSession(ctx.principal.tenant, ctx.session_id or "", SessionLog(), state, ctx.surface)
        try:
            if not await self._open(live, new=ctx.session_new):
                raise Conflict(
                    f"session '{live.session_id}' is streaming an answer on another replica; "
                    f"follow it with GET /v1/sessions/{live.session_id}/stream",
                    param="X-Session-Id",
                )
            live.renewed_at = time.monotonic()
            live.state_saved, live.fresh = True, False
        except StoreUnavailable as error:
            log.warning("session %s streams without a lease until the store answers: %s", live.session_id, error)
            live.renewed_at = -math.inf
        self._live.by_key[(live.tenant, live.session_id)] = live
        return live

    async def _open(self, live: LiveSession, new: bool) -> bool:
        """Claim the lease and save the state (and drop the previous answer's events) at once.
        `new`: the gateway made the session's id for this request (see SessionCheckpoint.new)."""
        first = SessionCheckpoint(
            live.tenant,
            live.session_id,
            ttl_of(live.state, self._settings),
            live.state,
            renew_owner=self._replica_id,
            lease_ttl_s=self._settings.lease_ttl_s,
            replace_events=True,
            new=new,
        )
        # A client that read [DONE] may ask for its next answer before the owner's last checkpoint
        # has let the lease go: wait that long (a few checkpoint intervals) before saying busy.
        deadline = time.monotonic() + max(_CLAIM_PATIENCE_S, 3 * self._settings.checkpoint_interval_s)
        while True:
            if await self._store.session_open(first):
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(TAIL_POLL_S)

    def unclaim(self, live: LiveSession) -> None:
        """The request failed before its first event: the checkpointer marks the session done and
        drops the lease."""
        if live.producer is None and not live.log.closed:
            live.log.close()
            self._live.wakeup.set()

    async def produce(self, ctx: RequestContext, chunks: AsyncGenerator[Chunk, None], live: LiveSession) -> None:
        events = StreamEvents(ctx)
        try:
            async with contextlib.aclosing(events.payloads(chunks)) as payloads:
                async for payload in payloads:
                    self._append(live, payload)
        except asyncio.CancelledError:
            # `on_client_disconnect: cancel`, or the session was deleted: readers must still see an end.
            self._finish(live, ctx.surface, events.failure_payloads(GenerationCancelled("generation cancelled")))
            raise
        if events.failure is not None:
            if not live.log.events:
                live.log.fail(events.failure)  # before the first event: an HTTP error status
                return
            for payload in events.failure_payloads():
                self._append(live, payload)
        if live.state.transcript is not None:  # opted in (see `state_of`)
            transcript = (*live.state.transcript, events.answer.message(ctx.resume))
            live.state = replace(live.state, transcript=transcript)
        self._finish(live, ctx.surface, [])

    def _finish(self, live: LiveSession, surface: Surface, error_events: list[bytes]) -> None:
        if live.log.closed:
            return
        if live.log.events:
            for payload in error_events:
                self._append(live, payload)
            if live.state.kept:  # retrieved as its last event showed it (completed, failed, ...)
                live.state = replace(live.state, answer=surface.answer_of(live.log.events[-1][1]))
            if surface.done is not None:
                self._append(live, surface.done)
        live.log.close()
        self._live.wakeup.set()

    def _append(self, live: LiveSession, payload: bytes) -> None:
        live.log.append(payload)
        if len(live.log.events) - live.flushed >= self._settings.checkpoint_every_events:
            self._live.wakeup.set()

    async def remember(self, ctx: RequestContext, message: dict[str, Any], answer: dict[str, Any]) -> None:
        """Keep a non-streamed answer's transcript, if the request opted in: off the response path,
        unless the answer is kept as an object (`answer`, its body), which a request continuing it
        may name the moment the client has it."""
        kept = ctx.conversation is not None
        if ctx.principal is None or ctx.session_id is None or ctx.session_unresumable:
            return
        if not (ctx.keep_transcript or kept):
            return
        state = state_of(ctx, self._replica_id)
        transcript = (*(state.transcript or ()), message)
        # A kept answer's request is in its conversation now; its body is for a takeover, which a
        # finished answer never needs.
        body = None if kept else state.body
        state = replace(state, status="done", transcript=transcript, answer=answer if kept else None, body=body)
        save = self._store.session_save(ctx.principal.tenant, ctx.session_id, state, ttl_of(state, self._settings))
        if kept:
            try:
                await save
            except StoreUnavailable as error:
                log.warning("response %s answered but not kept (store unavailable): %s", ctx.session_id, error)
            return
        task = asyncio.get_running_loop().create_task(save)
        self._background.add(task)
        task.add_done_callback(self._saved)

    def _saved(self, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and isinstance(task.exception(), StoreUnavailable):
            log.warning("session transcript not saved: %s", task.exception())
