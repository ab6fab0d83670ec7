"""Sessions: streamed responses that survive the client, the backend and the replica.

A streamed response runs in its own task (the producer) and writes every SSE event to a
`SessionLog`; the HTTP response is only a reader of that log. So a client that drops its
connection loses nothing: generation goes on (or stops, per `on_client_disconnect`), and
`GET /v1/sessions/{id}/stream` with `Last-Event-ID` replays what it missed and follows the rest.

The checkpointer copies each live log to the store every `checkpoint_every_events` events or
`checkpoint_interval_s` (whichever comes first), off the request path, and renews the replica's
lease on the session; the lease itself is taken, and the state saved, before the backend is
asked for anything (`ClaimSession`), so no other replica can take over a live stream however
early a client reconnects. Trade-off: a replica that dies loses at most the events of the last
interval. Another replica that a client reconnects to finds the checkpoint, waits for the lease
to lapse, takes the session over, and continues generation from the checkpointed text with the
same continuation mechanism as a backend failover; the events it regenerates get the same
sequence numbers, and the reader skips those the client already has.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from gateway import sse
from gateway.auth.principal import Principal
from gateway.backends.base import Chunk, Usage
from gateway.errors import Conflict, InvalidRequest, NotFound, StoreCorrupt, StoreUnavailable
from gateway.http.errors import error_body, gateway_error_body, stream_failure
from gateway.pipeline import Handler, RequestContext
from gateway.session_log import SessionLog, content_of
from gateway.settings import DisconnectPolicy, SessionSettings
from gateway.store.base import SessionCheckpoint, SessionStore
from gateway.store.session_record import SessionState
from gateway.wire import ChunkRenderer, Completion, dumps

T = TypeVar("T")

log = logging.getLogger(__name__)

SESSION_HEADER = "x-session-id"
APPEND_HEADER = "x-session-append"
SHARE_HEADER = "x-session-share"  # "tenant": every key of the tenant may use it; "key" (default): its key only
_VALID_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_PAGE = 500
_TAIL_POLL_S = 0.05
_KEEP_ALIVE_S = 10.0
_MAX_BACKOFF_S = 2.0  # checkpoint retries against a store that is down: at least this often
_LOG_EVERY_S = 10.0  # ... and a warning about it at most this often
_CLAIM_PATIENCE_S = 0.5


def session_id_from(headers: Mapping[str, str]) -> str:
    given = headers.get(SESSION_HEADER)
    if given is None:
        return f"sess_{secrets.token_hex(12)}"
    if not _VALID_ID.match(given):
        raise InvalidRequest("X-Session-Id must be 1-128 characters of A-Z a-z 0-9 . _ : -", param="X-Session-Id")
    return given


def may_open(principal: Principal, state: SessionState) -> bool:
    """A session belongs to the key that created it, unless that key shared it with its tenant (the
    store keys sessions by tenant, so "shared" never reaches past the tenant)."""
    return state.key_id == principal.key_id or state.shared


def _share_from(headers: Mapping[str, str]) -> bool | None:
    given = headers.get(SHARE_HEADER)
    if given is None:
        return None
    if given not in ("tenant", "key"):
        raise InvalidRequest("X-Session-Share must be 'tenant' or 'key'", param="X-Session-Share")
    return given == "tenant"


@dataclass
class LiveSession:
    tenant: str
    session_id: str
    log: SessionLog
    state: SessionState
    flushed: int = 0  # how many of log.events the store has
    state_saved: bool = False
    readers: int = 0
    producer: asyncio.Task[None] | None = None
    renewed_at: float = field(default_factory=time.monotonic)
    fresh: bool = True  # a new response: its first checkpoint replaces the previous response's events


class SessionManager:
    def __init__(
        self, store: SessionStore, settings: SessionSettings, replica_id: str, continue_stream: Handler
    ) -> None:
        self._store = store
        self._settings = settings
        self._replica_id = replica_id
        self._continue_stream = continue_stream  # the pipeline for a takeover: no auth/quota again
        self._live: dict[tuple[str, str], LiveSession] = {}
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        # Told (seconds, sessions) after each checkpoint write: telemetry records the latency.
        self.on_checkpoint: Callable[[float, int], None] | None = None
        self.checkpoint_failures = 0  # attempts that found the store unavailable

    # --- a new streamed response ------------------------------------------------------------
    async def start(self, ctx: RequestContext, chunks: AsyncGenerator[Chunk, None]) -> LiveSession:
        """Run `chunks` in a producer task that records every event; return once the first event
        exists. An error before it is raised here, so that it becomes an HTTP error status."""
        # The caller pulled the first chunk already, so authentication has run: the state is
        # complete before the producer starts (a fast stream may finish before `started()` returns).
        assert ctx.principal is not None
        key = (ctx.principal.tenant, ctx.session_id or "")
        live = self._live.get(key)
        if live is None or live.state.completion_id != ctx.completion_id or live.producer is not None:
            live = LiveSession(key[0], key[1], SessionLog(), _state_of(ctx, self._replica_id))
        live.producer = asyncio.get_running_loop().create_task(self._produce(ctx, chunks, live))
        await live.log.started()
        if live.log.failure is not None:
            raise live.log.failure
        self._live[key] = live
        self._wakeup.set()
        return live

    async def claim(self, ctx: RequestContext) -> LiveSession:
        """Own the session before the first upstream byte: take its lease and save its state, so
        that a client reconnecting to another replica follows this one instead of taking over.
        Another live owner means the session is busy (409). With the store down the stream goes
        on unowned, and the first checkpoint claims the lease before it saves the state."""
        assert ctx.principal is not None
        live = LiveSession(ctx.principal.tenant, ctx.session_id or "", SessionLog(), _state_of(ctx, self._replica_id))
        try:
            if not await self._claim_lease(live):
                raise Conflict(
                    f"session '{live.session_id}' is streaming an answer on another replica; "
                    f"follow it with GET /v1/sessions/{live.session_id}/stream",
                    param="X-Session-Id",
                )
            live.renewed_at = time.monotonic()
            first = SessionCheckpoint(
                live.tenant, live.session_id, self._settings.resume_ttl_s, live.state, replace_events=True
            )
            await self._store.session_checkpoint([first])
            live.state_saved, live.fresh = True, False
        except StoreUnavailable as error:
            log.warning("session %s streams without a lease until the store answers: %s", live.session_id, error)
            live.renewed_at = -math.inf
        self._live[(live.tenant, live.session_id)] = live
        return live

    async def _claim_lease(self, live: LiveSession) -> bool:
        # A client that read [DONE] may ask for its next answer before the owner's last checkpoint
        # has let the lease go: wait that long (a few checkpoint intervals) before saying busy.
        deadline = time.monotonic() + max(_CLAIM_PATIENCE_S, 3 * self._settings.checkpoint_interval_s)
        while True:
            ttl = self._settings.lease_ttl_s
            if await self._store.session_claim(live.tenant, live.session_id, self._replica_id, ttl):
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(_TAIL_POLL_S)

    def unclaim(self, live: LiveSession) -> None:
        """The request failed before its first event: the checkpointer marks the session done and
        drops the lease."""
        if live.producer is None and not live.log.closed:
            live.log.close()
            self._wakeup.set()

    async def _produce(self, ctx: RequestContext, chunks: AsyncGenerator[Chunk, None], live: LiveSession) -> None:
        renderer = ChunkRenderer(ctx.completion_id, ctx.created, ctx.model)
        answer = Completion()
        try:
            async with contextlib.aclosing(chunks):
                async for chunk in chunks:
                    answer.add(chunk)
                    rendered = renderer.render(chunk)
                    if rendered is not None:
                        self._append(live, dumps(rendered))
            if ctx.include_usage:
                self._append(live, dumps(renderer.render_usage(ctx.usage)))
        except Exception as exc:  # noqa: BLE001 (a bug too gets a clean end; stream_failure logs it)
            error = stream_failure(exc)
            if not live.log.events:
                live.log.fail(error)
                return
            self._append(live, dumps(gateway_error_body(error)))
        except asyncio.CancelledError:
            # `on_client_disconnect: cancel`, or the session was deleted: readers must still see an end.
            self._finish(live, dumps(error_body("generation cancelled", "api_error", "cancelled")))
            raise
        if live.state.transcript is not None:  # opted in (see `_state_of`)
            transcript = (*ctx.body.get("messages", []), answer.message(ctx.resume))
            live.state = replace(live.state, transcript=transcript)
        self._finish(live, None)

    def _finish(self, live: LiveSession, error_event: bytes | None) -> None:
        if live.log.closed:
            return
        if error_event is not None and live.log.events:
            self._append(live, error_event)
        if live.log.events:
            self._append(live, sse.DONE_PAYLOAD)
        live.log.close()
        self._wakeup.set()

    def _append(self, live: LiveSession, payload: bytes) -> None:
        live.log.append(payload)
        if len(live.log.events) - live.flushed >= self._settings.checkpoint_every_events:
            self._wakeup.set()

    def remember(self, ctx: RequestContext, message: dict[str, Any]) -> None:
        """Keep a non-streamed answer's transcript (off the response path), if the request opted in."""
        if ctx.principal is None or ctx.session_id is None or not ctx.keep_transcript:
            return
        transcript = (*ctx.body.get("messages", []), message)
        state = replace(_state_of(ctx, self._replica_id), status="done", transcript=transcript)
        save = self._store.session_save(ctx.principal.tenant, ctx.session_id, state, self._settings.resume_ttl_s)
        task = asyncio.get_running_loop().create_task(save)
        self._background.add(task)
        task.add_done_callback(self._saved)

    def _saved(self, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and isinstance(task.exception(), StoreUnavailable):
            log.warning("session transcript not saved: %s", task.exception())

    # --- readers ------------------------------------------------------------------------------
    async def frames(self, live: LiveSession, after_seq: int) -> AsyncIterator[bytes]:
        """SSE frames for one reader. When the last reader goes away the producer goes on, unless
        `on_client_disconnect: cancel`."""
        live.readers += 1
        try:
            async for event in live.log.follow(after_seq, idle_s=_KEEP_ALIVE_S):
                # A long wait (a tool call held for human approval) must not look like a dead link.
                yield sse.KEEP_ALIVE if event is None else sse.frame(*event)
        finally:
            live.readers -= 1
            policy = self._settings.on_client_disconnect
            if live.readers == 0 and not live.log.closed and policy is DisconnectPolicy.CANCEL and live.producer:
                live.producer.cancel()

    async def resume(self, principal: Principal, session_id: str, after_seq: int) -> AsyncIterator[bytes]:
        """Frames after `after_seq` of a session's latest response: from memory if this replica
        is streaming it, else from the checkpoint, taking the session over if its owner died."""
        live = self._live.get((principal.tenant, session_id))
        if live is not None and may_open(principal, live.state):
            return self.frames(live, after_seq)
        state = await self._store.session_load(principal.tenant, session_id)
        if state is None or not may_open(principal, state):
            raise NotFound(f"session '{session_id}' not found")
        if state.status != "streaming" and not await self._store.session_events(principal.tenant, session_id, 0, 1):
            raise NotFound(f"session '{session_id}' has no streamed response to resume")
        if state.status == "streaming":
            # Checked now, while the client can still get an error status: a takeover needs these.
            _takeover_fields(state, session_id)
        return self._from_store(principal, session_id, state, after_seq)

    async def _from_store(
        self, principal: Principal, session_id: str, state: SessionState, after_seq: int
    ) -> AsyncIterator[bytes]:
        frames = self._stored_frames(principal, session_id, state, after_seq)
        async with contextlib.aclosing(frames):
            try:
                async for frame in frames:
                    yield frame
            except Exception as exc:  # noqa: BLE001 (headers are sent: the client gets an in-band end)
                yield sse.event(gateway_error_body(stream_failure(exc)))
                yield sse.DONE

    async def _stored_frames(
        self, principal: Principal, session_id: str, state: SessionState, after_seq: int
    ) -> AsyncGenerator[bytes, None]:
        seq = after_seq
        while True:
            events = await self._store.session_events(principal.tenant, session_id, seq, _PAGE)
            for event_seq, payload in events:
                yield sse.frame(event_seq, payload)
                seq = event_seq
                if payload == sse.DONE_PAYLOAD:
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
                live = await self._take_over(principal, session_id, state)
                async for frame in self.frames(live, seq):
                    yield frame
                return
            await asyncio.sleep(_TAIL_POLL_S)  # the owner is alive: follow its checkpoints

    async def _take_over(self, principal: Principal, session_id: str, state: SessionState) -> LiveSession:
        """Continue a dead replica's response from its checkpointed text, as the same request: its
        audit record (under the client's request id) and usage cover the whole answer, and its
        quota reservation is settled rather than a second one taken (as after a backend failover)."""
        recorded = await self._all_events(principal.tenant, session_id)
        text = "".join(content_of(payload) for _, payload in recorded)
        chunks_sent = sum(1 for _, payload in recorded if content_of(payload))
        completion_id, created, model, body = _takeover_fields(state, session_id)
        ctx = RequestContext(
            request_id=state.request_id or f"takeover-{secrets.token_hex(6)}",
            completion_id=completion_id,
            created=created,
            model=model,
            body=body,
            stream=True,
            include_usage=state.include_usage,
            principal=principal,
            session_id=session_id,
            # Nothing checkpointed yet: start afresh, role event included, so numbering matches.
            resume=(text, chunks_sent) if recorded else None,
            release=state.release,
            deployments=frozenset(state.deployments) if state.deployments else None,
            quota_hold=state.quota,
            # What the dead replica generated counts, though its usage never arrived.
            usage=Usage(completion_tokens=chunks_sent, total_tokens=chunks_sent),
            completion_text=[text] if text else [],
        )
        log_ = SessionLog()
        log_.extend(recorded)
        live = LiveSession(principal.tenant, session_id, log_, replace(state, owner=self._replica_id), fresh=False)
        live.flushed = len(recorded)
        live.producer = asyncio.get_running_loop().create_task(self._produce(ctx, self._continue_stream(ctx), live))
        self._live[(principal.tenant, session_id)] = live
        return live

    async def _all_events(self, tenant: str, session_id: str) -> list[tuple[int, bytes]]:
        events: list[tuple[int, bytes]] = []
        while True:
            page = await self._store.session_events(tenant, session_id, events[-1][0] if events else 0, _PAGE)
            events += page
            if len(page) < _PAGE:
                return events

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

    async def delete(self, principal: Principal, session_id: str) -> None:
        live = self._live.get((principal.tenant, session_id))
        state = live.state if live is not None else await self._store.session_load(principal.tenant, session_id)
        if state is not None and not may_open(principal, state):
            raise NotFound(f"session '{session_id}' not found")
        live = self._live.pop((principal.tenant, session_id), None)
        if live is not None and live.producer is not None:
            live.producer.cancel()
        if not await self._store.session_delete(principal.tenant, session_id) and live is None:
            raise NotFound(f"session '{session_id}' not found")

    # --- checkpoints ----------------------------------------------------------------------------
    def start_checkpoints(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._checkpoint_loop(), name="session-checkpoints")

    async def stop(self) -> None:
        """Finish the producers' work already recorded, write the last checkpoints, stop."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(StoreUnavailable):
            await self.checkpoint_all()

    async def _checkpoint_loop(self) -> None:
        # While the store is down, streams keep asking for checkpoints: retry with backoff instead
        # of at every wakeup, and say so once per _LOG_EVERY_S (issue 12: ~250 warnings/s).
        backoff, last_log = 0.0, -_LOG_EVERY_S
        while True:
            if backoff:
                await asyncio.sleep(backoff)
            else:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._settings.checkpoint_interval_s):
                        await self._wakeup.wait()
            self._wakeup.clear()
            try:
                await self.checkpoint_all()
            except StoreUnavailable as error:
                self.checkpoint_failures += 1
                backoff = min(max(self._settings.checkpoint_interval_s, backoff * 2), _MAX_BACKOFF_S)
                if time.monotonic() - last_log >= _LOG_EVERY_S:
                    last_log = time.monotonic()
                    log.warning("session checkpoints delayed (retrying every %.1f s at most): %s", backoff, error)
                continue
            if backoff:
                log.info("session checkpoints resumed")
            backoff = 0.0

    async def checkpoint_all(self) -> None:
        """Write every live session's news in one store call; forget sessions fully written."""
        now = time.monotonic()
        batch: list[tuple[tuple[str, str], LiveSession, SessionCheckpoint]] = []
        for key, live in list(self._live.items()):
            item = self._checkpoint_of(live, now)
            if item is not None:
                batch.append((key, live, item))
        if not batch:
            return
        started = time.monotonic()
        await self._store.session_checkpoint([item for _, _, item in batch])
        if self.on_checkpoint is not None:
            self.on_checkpoint(time.monotonic() - started, len(batch))
        for key, live, item in batch:
            live.state_saved = True
            live.fresh = False
            live.flushed += len(item.events)
            if item.renew_owner is not None:
                live.renewed_at = now
            if item.release_owner is not None:
                self._live.pop(key, None)

    def _checkpoint_of(self, live: LiveSession, now: float) -> SessionCheckpoint | None:
        if live.log.closed and live.state.status != "done":
            # Not opted in to a transcript: the request (prompts) was kept only for a takeover, now
            # impossible; what stays is what a resume replays, the events.
            body = live.state.body if live.state.transcript is not None else None
            live.state, live.state_saved = replace(live.state, status="done", body=body), False
        pending = live.log.events[live.flushed :]
        lease = self._settings.lease_ttl_s
        renew = not live.log.closed and now - live.renewed_at >= lease / 3
        finished = live.log.closed
        if live.state_saved and not pending and not renew and not finished:
            return None
        return SessionCheckpoint(
            tenant=live.tenant,
            session_id=live.session_id,
            ttl_s=self._settings.resume_ttl_s,
            state=None if live.state_saved else live.state,
            events=pending,
            renew_owner=self._replica_id if renew else None,
            lease_ttl_s=lease,
            release_owner=self._replica_id if finished else None,
            replace_events=live.fresh and live.flushed == 0,
        )


def _state_of(ctx: RequestContext, owner: str) -> SessionState:
    """What a stream's resume and takeover need; the transcript only if the request opted in."""
    return SessionState(
        request_id=ctx.request_id,
        quota=ctx.quota_hold,
        model=ctx.model,
        body=ctx.body,
        completion_id=ctx.completion_id,
        created=ctx.created,
        include_usage=ctx.include_usage,
        key_id=ctx.session_owner or (ctx.principal.key_id if ctx.principal else None),
        shared=ctx.session_shared,
        status="streaming",
        owner=owner,
        release=ctx.release,
        deployments=tuple(sorted(ctx.deployments)) if ctx.deployments is not None else None,
        transcript=tuple(ctx.body.get("messages", [])) if ctx.keep_transcript else None,
    )


def _takeover_fields(state: SessionState, session_id: str) -> tuple[str, int, str, dict[str, Any]]:
    """A streaming session's state always has what a takeover needs; one without it is corrupt:
    its completion id, created time, model and request body."""

    def required(value: T | None, name: str) -> T:
        if value is None:
            raise StoreCorrupt("session state", session_id, f"a streaming session's state has no {name}")
        return value

    return (
        required(state.completion_id, "completion_id"),
        required(state.created, "created"),
        required(state.model, "model"),
        required(state.body, "body"),
    )


class AssignSession:
    """The pipeline stage that names the session (from X-Session-Id, or a new id) and decides
    whether its transcript is kept: only when the client names a session (X-Session-Id,
    X-Session-Append) or the settings list the request's tenant or key."""

    def __init__(self, settings: SessionSettings) -> None:
        self._tenants = frozenset(settings.transcript_tenants)
        self._keys = frozenset(settings.transcript_keys)

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> AsyncGenerator[Chunk, None]:
        ctx.session_id = session_id_from(ctx.headers)
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
    the session's stream, so it is a write."""

    def __init__(self, store: SessionStore) -> None:
        self._store = store

    async def __call__(self, ctx: RequestContext, call_next: Handler) -> AsyncGenerator[Chunk, None]:
        append = ctx.headers.get(APPEND_HEADER, "").lower() == "true"
        if ctx.principal is not None and (append or SESSION_HEADER in ctx.headers):
            state = await self._store.session_load(ctx.principal.tenant, ctx.session_id or "")
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
