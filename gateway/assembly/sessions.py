"""Agent sessions: every request is assigned one, its history appended, and (when sessions are
on) its stream checkpointed under a lease this replica holds, so that a client can resume it here
or on another replica, which regenerates what a dead one did not finish."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from gateway.assembly.access import Access
from gateway.assembly.foundation import Foundation
from gateway.assembly.lifecycle import Part, started
from gateway.core.surface import Surfaces
from gateway.http.sessions_api import SessionsApi
from gateway.pipeline import Handler
from gateway.sessions.manager import SessionManager
from gateway.sessions.stage import AppendHistory, AssignSession, ClaimSession
from gateway.settings import Settings


@dataclass(frozen=True, slots=True)
class Sessions:
    manager: SessionManager | None  # None when sessions are off
    assign_session: AssignSession
    append_history: AppendHistory
    claim_session: ClaimSession | None  # the last stage: the lease exists before the first upstream byte
    part: Part


def build_sessions(
    settings: Settings, base: Foundation, access: Access, takeover: Handler, surfaces: Surfaces
) -> Sessions:
    """`takeover` regenerates the rest of a dead replica's stream for the client resuming it."""
    config = settings.sessions
    assign, append = AssignSession(config), AppendHistory(base.store, config)
    if not config.enabled:
        return Sessions(None, assign, append, None, Part())
    replica_id = f"replica-{uuid.uuid4().hex[:12]}"
    manager = SessionManager(
        base.store, config, replica_id, takeover, surfaces, on_checkpoint=base.telemetry.record_checkpoint
    )
    return Sessions(
        manager=manager,
        assign_session=assign,
        append_history=append,
        claim_session=ClaimSession(manager),
        part=Part(
            routes=SessionsApi(manager, access.authenticator).routes(),
            running=(started(manager.start_checkpoints, manager.stop),),
        ),
    )
