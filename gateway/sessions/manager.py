"""Sessions: streamed responses that survive the client, the backend and the replica.

A streamed response runs in its own task (producer.py) and writes every SSE event to a
`SessionLog` (event_log.py); the HTTP response is only a reader of that log, and a client that
reconnects replays what it missed and follows the rest (resume.py), from another replica too,
which takes the session over if its owner died. The checkpointer (checkpointer.py) copies the
live logs to the store and renews the replica's leases; the lease itself is taken, and the state
saved, before the backend is asked for anything (`ClaimSession`, stage.py).

`SessionManager` is what the rest of the gateway holds: the HTTP endpoints, the stages and the
app's lifespan.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from gateway.core.chunks import Chunk
from gateway.core.principal import Principal
from gateway.core.surface import Surfaces
from gateway.errors import Conflict, NotFound
from gateway.pipeline import Handler, RequestContext
from gateway.sessions.checkpointer import Checkpointer
from gateway.sessions.kept import KeptAnswer, KeptAnswers
from gateway.sessions.live import LiveSession, LiveSessions, may_open
from gateway.sessions.producer import Producer
from gateway.sessions.resume import Readers
from gateway.sessions.unresumable import UnresumableMarks
from gateway.settings import SessionSettings
from gateway.store.base import SessionStore

_CANCEL_PATIENCE_S = 5.0  # a cancelled producer ends at its next await; this long at most


class SessionManager:
    def __init__(
        self,
        store: SessionStore,
        settings: SessionSettings,
        replica_id: str,
        continue_stream: Handler,
        surfaces: Surfaces,
        on_checkpoint: Callable[[float, int], None] | None = None,
    ) -> None:
        """`on_checkpoint` is told (seconds, sessions) after each checkpoint write: telemetry
        records the latency."""
        self._store = store
        self._live = LiveSessions()
        self._checkpointer = Checkpointer(store, settings, replica_id, self._live, on_checkpoint)
        self._producer = Producer(store, settings, replica_id, self._live)
        self._readers = Readers(store, settings, replica_id, self._live, self._producer, continue_stream, surfaces)
        self._unresumable = UnresumableMarks(store, settings, self._live)
        self._kept = KeptAnswers(store, self._live, surfaces)

    # --- a new response -----------------------------------------------------------------------
    async def start(self, ctx: RequestContext, chunks: AsyncGenerator[Chunk, None]) -> LiveSession:
        """Run `chunks` in a producer task that records every event; return once the first event
        exists. An error before it is raised here, so that it becomes an HTTP error status."""
        return await self._producer.start(ctx, chunks)

    async def claim(self, ctx: RequestContext) -> LiveSession:
        """Own the session before the first upstream byte (see `Producer.claim`)."""
        return await self._producer.claim(ctx)

    def unclaim(self, live: LiveSession) -> None:
        """The request failed before its first event: the checkpointer marks the session done and
        drops the lease."""
        self._producer.unclaim(live)

    def mark_unresumable(self, ctx: RequestContext) -> None:
        """An answer served while the store was down: once it is back, a resume says so."""
        self._unresumable.mark(ctx)

    async def remember(self, ctx: RequestContext, message: dict[str, Any], answer: dict[str, Any]) -> None:
        """Keep a non-streamed answer's transcript if the request opted in, and the answer (its
        body) if it is kept as an object (see `Producer.remember`)."""
        await self._producer.remember(ctx, message, answer)

    # --- readers ------------------------------------------------------------------------------
    def frames(self, live: LiveSession, after_seq: int) -> AsyncIterator[bytes]:
        """SSE frames for one reader. When the last reader goes away the producer goes on, unless
        `on_client_disconnect: cancel`."""
        return self._readers.frames(live, after_seq)

    async def resume(
        self, principal: Principal, session_id: str, after_seq: int, request_id: str | None = None
    ) -> AsyncIterator[bytes]:
        """Frames after `after_seq` of a session's latest response (see `Readers.resume`)."""
        return await self._readers.resume(principal, session_id, after_seq, request_id)

    async def transcript(self, principal: Principal, session_id: str) -> dict[str, Any]:
        state = await self._store.session_load(principal.tenant, session_id)
        if state is None or not may_open(principal, state):
            raise NotFound(f"session '{session_id}' not found")
        return {
            "id": session_id,
            "object": "session",
            "status": state.status,
            "messages": list(state.transcript or ()),
        }

    async def kept_answer(self, principal: Principal, answer_id: str) -> KeptAnswer:
        """A kept answer (a stored Responses response) and its input items; 404 for any other id.
        One still being made by a replica that died is taken over here: a poll keeps it going."""
        state = await self._kept.state(principal, answer_id)
        await self._readers.adopt(principal, answer_id, state)
        return await self._kept.get(principal, answer_id)

    async def cancel_kept(self, principal: Principal, answer_id: str) -> KeptAnswer:
        """Stop a kept answer still being made here; one that has ended is returned as it is."""
        state = await self._kept.state(principal, answer_id)
        live = self._live.by_key.get((principal.tenant, answer_id))
        if live is not None and live.producer is not None and not live.log.closed:
            live.producer.cancel()
            await asyncio.wait({live.producer}, timeout=_CANCEL_PATIENCE_S)
        elif live is None and state.status == "streaming":
            raise Conflict(
                f"Response '{answer_id}' is being generated by another replica: cancel it there "
                f"(it follows the stream: GET /v1/responses/{answer_id}?stream=true)"
            )
        return await self._kept.get(principal, answer_id)

    async def delete_kept(self, principal: Principal, answer_id: str) -> None:
        """Forget a kept answer (stopping it if it is still being made); 404 for any other id."""
        await self._kept.state(principal, answer_id)
        await self.delete(principal, answer_id)

    async def delete(self, principal: Principal, session_id: str) -> None:
        live = self._live.by_key.get((principal.tenant, session_id))
        state = live.state if live is not None else await self._store.session_load(principal.tenant, session_id)
        if state is not None and not may_open(principal, state):
            raise NotFound(f"session '{session_id}' not found")
        live = self._live.by_key.pop((principal.tenant, session_id), None)
        if live is not None and live.producer is not None:
            live.producer.cancel()
        if not await self._store.session_delete(principal.tenant, session_id) and live is None:
            raise NotFound(f"session '{session_id}' not found")

    # --- checkpoints ----------------------------------------------------------------------------
    @property
    def checkpoint_failures(self) -> int:
        """Checkpoint attempts that found the store unavailable."""
        return self._checkpointer.failures

    def start_checkpoints(self) -> None:
        self._checkpointer.start()

    async def stop(self) -> None:
        """Finish the producers' work already recorded, write the last checkpoints, stop."""
        await self._unresumable.drain()
        await self._checkpointer.stop()

    async def checkpoint_all(self) -> None:
        """Write every live session's news in one store call; forget sessions fully written."""
        await self._checkpointer.checkpoint_all()
