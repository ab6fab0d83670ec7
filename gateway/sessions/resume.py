"""Readers of a session's stream: the live response, a resume, and the takeover of a dead owner's stream.

`GET /v1/sessions/{id}/stream` with `Last-Event-ID` replays what a client missed and follows the
rest: from memory if this replica streams the session, else from its checkpoint. A replica that
a client reconnects to finds the checkpoint, waits for the owner's lease to lapse, takes the
session over, and continues generation from the checkpointed text with the same continuation
mechanism as a backend failover; the events it regenerates get the same sequence numbers, and
the reader skips those the client already has.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import replace

from gateway.core.chunks import Usage
from gateway.core.error_bodies import stream_failure
from gateway.core.principal import Principal
from gateway.core.surface import AnswerHead, Surface, Surfaces
from gateway.errors import NotFound, SessionNotResumable
from gateway.pipeline import Handler, RequestContext
from gateway.sessions.event_log import SessionLog
from gateway.sessions.live import TAIL_POLL_S, LiveSession, LiveSessions, may_open, takeover_fields
from gateway.sessions.producer import Producer
from gateway.sessions.unresumable import UNRESUMABLE
from gateway.settings import DisconnectPolicy, SessionSettings
from gateway.store.base import SessionStore
from gateway.store.session_record import SessionState

_PAGE = 500
_KEEP_ALIVE_S = 10.0
# An SSE comment: every client, of every surface, skips it.
_KEEP_ALIVE = b": keep-alive\n\n"


class Readers:
    def __init__(
        self,
        store: SessionStore,
        settings: SessionSettings,
        replica_id: str,
        live: LiveSessions,
        producer: Producer,
        continue_stream: Handler,
        surfaces: Surfaces,
    ) -> None:
        self._store = store
        self._surfaces = surfaces
        self._settings = settings
        self._replica_id = replica_id
        self._live = live
        self._producer = producer
        self._continue_stream = continue_stream  # the pipeline for a takeover: no auth/quota again

    async def frames(self, live: LiveSession, after_seq: int) -> AsyncIterator[bytes]:
        """SSE frames for one reader. When the last reader goes away the producer goes on, unless
        `on_client_disconnect: cancel`."""
        live.readers += 1
        frame = live.surface.frame
        try:
            async for events in live.log.follow(after_seq, idle_s=_KEEP_ALIVE_S):
                # A long wait (a tool call held for human approval) must not look like a dead link.
                yield _KEEP_ALIVE if events is None else b"".join(frame(*event) for event in events)
        finally:
            live.readers -= 1
            policy = self._settings.on_client_disconnect
            cancel = policy is DisconnectPolicy.CANCEL and not live.detached
            if live.readers == 0 and not live.log.closed and cancel and live.producer:
                live.producer.cancel()

    async def resume(
        self, principal: Principal, session_id: str, after_seq: int, request_id: str | None = None
    ) -> AsyncIterator[bytes]:
        """Frames after `after_seq` of a session's latest response: from memory if this replica
        is streaming it, else from the checkpoint, taking the session over if its owner died."""
        live = self._live.by_key.get((principal.tenant, session_id))
        if live is not None and may_open(principal, live.state):
            return self.frames(live, after_seq)
        state = await self._store.session_load(principal.tenant, session_id)
        if state is None or not may_open(principal, state):
            raise NotFound(f"session '{session_id}' not found")
        if state.status == UNRESUMABLE:
            raise SessionNotResumable(
                f"The latest answer of session '{session_id}' (request {state.request_id}) was served while the "
                "gateway's state store was unavailable, without a checkpoint: it cannot be resumed. "
                "Send the request again."
            )
        if state.status != "streaming" and not await self._store.session_events(principal.tenant, session_id, 0, 1):
            raise NotFound(f"session '{session_id}' has no streamed response to resume")
        surface = self._surface_of(state, session_id)
        if state.status == "streaming":
            # Checked now, while the client can still get an error status: a takeover needs these.
            takeover_fields(state, session_id)
        return self._from_store(principal, session_id, state, surface, after_seq, request_id)

    def _surface_of(self, state: SessionState, session_id: str) -> Surface:
        surface = self._surfaces.named(state.surface)
        if surface is None:  # written by a replica of a newer version, serving a surface this one lacks
            raise SessionNotResumable(
                f"session '{session_id}' streams over the '{state.surface}' API, which this replica does "
                "not serve: resume it from a replica that does"
            )
        return surface

    async def _from_store(
        self,
        principal: Principal,
        session_id: str,
        state: SessionState,
        surface: Surface,
        after_seq: int,
        request_id: str | None,
    ) -> AsyncIterator[bytes]:
        frames = self._stored_frames(principal, session_id, state, surface, after_seq)
        async with contextlib.aclosing(frames):
            try:
                async for frame in frames:
                    yield frame
            except Exception as exc:  # noqa: BLE001 (headers are sent: the client gets an in-band end)
                failure = stream_failure(exc)
                failure.request_id = request_id
                for payload in surface.writer(_head_of(state)).fail(failure):
                    yield surface.frame(None, payload)
                if surface.done is not None:
                    yield surface.frame(None, surface.done)

    async def _stored_frames(
        self, principal: Principal, session_id: str, state: SessionState, surface: Surface, after_seq: int
    ) -> AsyncGenerator[bytes, None]:
        seq = after_seq
        while True:
            events = await self._store.session_events(principal.tenant, session_id, seq, _PAGE)
            for event_seq, payload in events:
                yield surface.frame(event_seq, payload)
                seq = event_seq
                if payload == surface.done:
                    return
            if len(events) == _PAGE:
                continue
            if state.status != "streaming":
                return  # finished, and every stored event has been sent
            if await self._store.session_claim(
                principal.tenant, session_id, self._replica_id, self._settings.lease_ttl_s
            ):
                # The owner may have finished (and let go) since the state was read: then the
                # rest is in the store, and nothing is generated again.
                state = await self._store.session_load(principal.tenant, session_id) or state
                if state.status != "streaming":
                    await self._store.session_release(principal.tenant, session_id, self._replica_id)
                    continue
                live = await self._take_over(principal, session_id, state, surface)
                async for frame in self.frames(live, seq):
                    yield frame
                return
            await asyncio.sleep(TAIL_POLL_S)  # the owner is alive: follow its checkpoints

    async def adopt(self, principal: Principal, session_id: str, state: SessionState) -> None:
        """Take a streaming session over if its owner died (its lease lapsed), though nobody
        follows its stream: a kept answer being made in the background, asked about by a poll."""
        if state.status != "streaming" or (principal.tenant, session_id) in self._live.by_key:
            return
        if not await self._store.session_claim(
            principal.tenant, session_id, self._replica_id, self._settings.lease_ttl_s
        ):
            return  # its owner is alive
        current = await self._store.session_load(principal.tenant, session_id)
        if current is None or current.status != "streaming":  # it ended since it was read
            await self._store.session_release(principal.tenant, session_id, self._replica_id)
            return
        await self._take_over(principal, session_id, current, self._surface_of(current, session_id))

    async def _take_over(
        self, principal: Principal, session_id: str, state: SessionState, surface: Surface
    ) -> LiveSession:
        """Continue a dead replica's response from its checkpointed text, as the same request: its
        audit record (under the client's request id) and usage cover the whole answer, and its
        quota reservation is settled rather than a second one taken (as after a backend failover)."""
        recorded = await self._all_events(principal.tenant, session_id)
        texts = [surface.text_of(payload) for _, payload in recorded]
        text, chunks_sent = "".join(texts), sum(1 for t in texts if t)
        completion_id, created, model, body = takeover_fields(state, session_id)
        ctx = RequestContext(
            request_id=state.request_id or f"takeover-{secrets.token_hex(6)}",
            completion_id=completion_id,
            surface=surface,
            created=created,
            model=model,
            body=body,
            stream=True,
            include_usage=state.include_usage,
            principal=principal,
            session_id=session_id,
            # Nothing checkpointed yet: start afresh, role event included, so numbering matches.
            resume=(text, chunks_sent) if recorded else None,
            resumed_events=tuple(payload for _, payload in recorded),
            echo=state.echo or {},
            release=state.release,
            deployments=frozenset(state.deployments) if state.deployments else None,
            quota_hold=state.quota,
            # What the dead replica generated counts, though its usage never arrived.
            usage=Usage(completion_tokens=chunks_sent, total_tokens=chunks_sent),
            completion_text=[text] if text else [],
        )
        log_ = SessionLog()
        log_.extend(recorded)
        owned = replace(state, owner=self._replica_id)
        live = LiveSession(principal.tenant, session_id, log_, owned, surface, fresh=False)
        live.flushed = len(recorded)
        live.detached = state.kept  # a kept answer is read by whoever asks for it: no reader's leaving stops it
        produce = self._producer.produce(ctx, self._continue_stream(ctx), live)
        live.producer = asyncio.get_running_loop().create_task(produce)
        self._live.by_key[(principal.tenant, session_id)] = live
        return live

    async def _all_events(self, tenant: str, session_id: str) -> list[tuple[int, bytes]]:
        events: list[tuple[int, bytes]] = []
        while True:
            page = await self._store.session_events(tenant, session_id, events[-1][0] if events else 0, _PAGE)
            events += page
            if len(page) < _PAGE:
                return events


def _head_of(state: SessionState) -> AnswerHead:
    """The head of the answer a stored state describes, for an in-band error event's writer."""
    return AnswerHead(state.completion_id or "", state.created or 0, state.model or "", state.include_usage)
