"""Answers served while the store was down (`sessions.on_store_error: serve_unresumable`).

Such an answer has no checkpoint, so a resume of its session would replay the answer before it.
Once the store is back the session is marked: its state says `unresumable`, and a resume gets a
409 that says why. The mark never takes a session from its owner: it is written only if the
session is this key's (or shared with it), is not streaming, and holds no answer newer than this
one; the load and the save are two calls, so an answer started between them by another replica
can be marked - it then tells its client to ask again, which loses nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

from gateway.auth.principal import Principal
from gateway.errors import StoreUnavailable
from gateway.pipeline import RequestContext
from gateway.sessions.live import may_open
from gateway.settings import SessionSettings
from gateway.store.base import SessionStore
from gateway.store.session_record import SessionState

# The name sessions logged under as one module, gateway/sessions.py: operators filter by it.
log = logging.getLogger("gateway.sessions")

UNRESUMABLE = "unresumable"
_RETRY_S = (0.1, 2.0)  # waiting for the store: first retry, longest wait


class UnresumableMarks:
    def __init__(self, store: SessionStore, settings: SessionSettings) -> None:
        self._store = store
        self._settings = settings
        self._pending: set[asyncio.Task[None]] = set()

    def mark(self, ctx: RequestContext) -> None:
        """Mark the session in the background, as soon as the store answers (for at most the
        session's resume TTL: past it the session is gone anyway)."""
        assert ctx.principal is not None
        assert ctx.session_id is not None
        answer = SessionState(
            status=UNRESUMABLE,
            request_id=ctx.request_id,
            completion_id=ctx.completion_id,
            created=ctx.created,
            key_id=ctx.principal.key_id,
            shared=ctx.session_shared,
        )
        task = asyncio.get_running_loop().create_task(self._mark(ctx.principal, ctx.session_id, answer))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _mark(self, principal: Principal, session_id: str, answer: SessionState) -> None:
        deadline = time.monotonic() + self._settings.resume_ttl_s
        delay = _RETRY_S[0]
        while True:
            try:
                await self._mark_once(principal, session_id, answer)
                return
            except StoreUnavailable as error:
                if time.monotonic() + delay > deadline:
                    log.warning("session %s not marked unresumable: %s", session_id, error)
                    return
            await asyncio.sleep(delay)
            delay = min(delay * 2, _RETRY_S[1])

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
        for task in list(self._pending):
            task.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)
