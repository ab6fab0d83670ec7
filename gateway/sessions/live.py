"""A session streaming on this replica, and the state a stream saves for its resume and takeover.

`LiveSessions` is the one table of live sessions the producer, the readers and the checkpointer
share; its `wakeup` tells the checkpointer there is something to write.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gateway.core.principal import Principal
from gateway.core.surface import Surface
from gateway.errors import StoreCorrupt
from gateway.pipeline import RequestContext
from gateway.sessions.event_log import SessionLog
from gateway.settings import SessionSettings
from gateway.store.session_record import SessionState

T = TypeVar("T")

TAIL_POLL_S = 0.05  # how often a lease is asked for again, and a live owner's checkpoints read


@dataclass
class LiveSession:
    tenant: str
    session_id: str
    log: SessionLog
    state: SessionState
    surface: Surface  # the API its client speaks: writes and frames its events
    flushed: int = 0  # how many of log.events the store has
    state_saved: bool = False
    readers: int = 0
    producer: asyncio.Task[None] | None = None
    renewed_at: float = field(default_factory=time.monotonic)
    fresh: bool = True  # a new response: its first checkpoint replaces the previous response's events
    detached: bool = False  # made in the background: no reader's leaving stops it


class LiveSessions:
    """The sessions this replica streams, by (tenant, session id)."""

    def __init__(self) -> None:
        self.by_key: dict[tuple[str, str], LiveSession] = {}
        self.wakeup = asyncio.Event()


def may_open(principal: Principal, state: SessionState) -> bool:
    """A session belongs to the key that created it, unless that key shared it with its tenant (the
    store keys sessions by tenant, so "shared" never reaches past the tenant)."""
    return state.key_id == principal.key_id or state.shared


def state_of(ctx: RequestContext, owner: str) -> SessionState:
    """What a stream's resume and takeover need; the transcript only if the request opted in (or
    its answer is kept, which needs its conversation for a request that continues it)."""
    if ctx.conversation is not None:
        transcript: tuple[dict[str, Any], ...] | None = ctx.conversation
    else:
        transcript = tuple(ctx.body.get("messages", [])) if ctx.keep_transcript else None
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
        transcript=transcript,
        surface=ctx.surface.name,
        input_items=ctx.kept_items if ctx.conversation is not None else None,
        echo=dict(ctx.echo) or None,
    )


def ttl_of(state: SessionState, settings: SessionSettings) -> float:
    """How long the store keeps a session: a kept answer for its retention, others for resume."""
    return settings.kept_answer_ttl_s if state.kept else settings.resume_ttl_s


def takeover_fields(state: SessionState, session_id: str) -> tuple[str, int, str, dict[str, Any]]:
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
