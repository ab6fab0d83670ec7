"""Answers served while the store was down (`sessions.on_store_error: serve_unresumable`).

Such an answer has no checkpoint, so a resume of its session would replay the answer before it.
Once the store is back the session is marked: its state says `unresumable`, and a resume gets a
409 that says why. The mark never takes a session from its owner: it is written only if the
session is this key's (or shared with it), is not streaming, and holds no answer newer than this
one; the load and the save are two calls, so an answer started between them by another replica
can be marked - it then tells its client to ask again, which loses nothing.

A mark waits for this replica's checkpoint of the session's earlier answer: an answer that ended
just before the store went away may still be waiting to be written, and written after the mark it
would land over it (a resume would replay that earlier answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, replace

from gateway.core.principal import Principal
from gateway.errors import StoreCorrupt, StoreUnavailable
from gateway.pipeline import RequestContext
from gateway.sessions.live import LiveSessions, may_open
from gateway.settings import SessionSettings
from gateway.store.base import SessionStore
from gateway.store.session_record import SessionState

# The name sessions logged under as one module, gateway/sessions.py: operators filter by it.
log = logging.getLogger("gateway.sessions")

UNRESUMABLE = "unresumable"
_RETRY_S = (0.1, 2.0)  # waiting for the store: first retry, longest wait
# Sessions waiting to be marked: one entry each (its latest answer), so a long outage under load
# holds at most this many, and one task writes them all when the store is back.
MAX_MARKS = 10_000


@dataclass(slots=True)
class _Mark:
    principal: Principal
    answer: SessionState
    until: float  # past the session's resume TTL there is nothing left to mark


class UnresumableMarks:
    def __init__(self, store: SessionStore, settings: SessionSettings, live: LiveSessions) -> None:
        self._store = store
        self._settings = settings
        self._live = live
        self._marks: dict[tuple[str, str], _Mark] = {}
        self._writer: asyncio.Task[None] | None = None
        self.dropped = 0  # marks not kept: MAX_MARKS sessions were waiting already

    def mark(self, ctx: RequestContext) -> None:
        """Mark the session as soon as the store answers (for at most the session's resume TTL:
        past it the session is gone anyway)."""
        assert ctx.principal is not None
        assert ctx.session_id is not None
        key = (ctx.principal.tenant, ctx.session_id)
        if key not in self._marks and len(self._marks) >= MAX_MARKS:
            self.dropped += 1
            log.warning("session %s not marked unresumable: %d sessions wait already", ctx.session_id, MAX_MARKS)
            return
        answer = SessionState(
            status=UNRESUMABLE,
            request_id=ctx.request_id,
            completion_id=ctx.completion_id,
            created=ctx.created,
            key_id=ctx.principal.key_id,
            shared=ctx.session_shared,
        )
        self._marks[key] = _Mark(ctx.principal, answer, time.monotonic() + self._settings.resume_ttl_s)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write_all(), name="session-marks")

    async def _write_all(self) -> None:
        """Write every waiting mark, retrying with backoff while the store is down."""
        delay = _RETRY_S[0]
        while self._marks:
            ready = self._next_ready()
            if ready is None:  # every mark waits for an earlier answer's checkpoint
                await asyncio.sleep(_RETRY_S[0])
                continue
            key, mark = ready
            try:
                await self._mark_once(mark.principal, key[1], mark.answer)
            except StoreUnavailable as error:
                log.info("session marks wait for the store (%d sessions): %s", len(self._marks), error)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RETRY_S[1])
                continue
            except StoreCorrupt as error:  # the session's record does not decode: nothing to mark
                log.error("session %s not marked unresumable: %s", key[1], error.message)
            if self._marks.get(key) is mark:  # not replaced by a newer answer meanwhile
                del self._marks[key]
            delay = _RETRY_S[0]

    def _next_ready(self) -> tuple[tuple[str, str], _Mark] | None:
        """The first mark whose session has no checkpoint of this replica's still to be written;
        marks past their session's TTL are dropped on the way."""
        now = time.monotonic()
        for key, mark in list(self._marks.items()):
            if now > mark.until:
                del self._marks[key]
            elif key not in self._live.by_key:
                return key, mark
        return None

    async def _mark_once(self, principal: Principal, session_id: str, answer: SessionState) -> None:
        tenant = principal.tenant
        current = await self._store.session_load(tenant, session_id)
        if current is not None:
            newer = (current.created or 0) > (answer.created or 0)
            if not may_open(principal, current) or current.status == "streaming" or newer:
                return
            # Who may use the session stays as it was; its transcript, without this answer, too.
            answer = replace(
                current,
                status=answer.status,
                request_id=answer.request_id,
                completion_id=answer.completion_id,
                created=answer.created,
                owner=None,
                quota=None,
                body=None,
            )
        await self._store.session_save(tenant, session_id, answer, self._settings.resume_ttl_s)

    async def drain(self) -> None:
        """Shutdown: marks still waiting for the store are given up."""
        if self._writer is not None:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
