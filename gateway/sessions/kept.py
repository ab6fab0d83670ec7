"""Kept answers: a surface's answer kept as an object of its own (a Responses response with
`store: true`), retrieved by its id. A kept answer is a session named by the answer's id, so it
has everything a session has: its owner and sharing, its stream's resume and takeover, its
expiry (`kept_answer_ttl_s`). What it adds is kept in its state: its input items and, once it
ended, the answer as its client last saw it (`SessionState.input_items`, `.answer`)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from gateway.core.principal import Principal
from gateway.core.surface import Surfaces
from gateway.errors import Conflict, NotFound, StoreCorrupt
from gateway.sessions.live import TAIL_POLL_S, LiveSessions, may_open
from gateway.store.base import SessionStore
from gateway.store.session_record import SessionState


@dataclass(frozen=True, slots=True)
class KeptAnswer:
    answer: dict[str, Any]  # as its client last saw it; an answer still being made, as it began
    input_items: tuple[dict[str, Any], ...]


class KeptAnswers:
    def __init__(self, store: SessionStore, live: LiveSessions, surfaces: Surfaces, patience_s: float) -> None:
        self._store = store
        self._live = live
        self._surfaces = surfaces
        self._patience_s = patience_s

    async def state(self, principal: Principal, answer_id: str) -> SessionState:
        """404 for an id that is not a kept answer the principal may open: never its content."""
        live = self._live.by_key.get((principal.tenant, answer_id))
        state = live.state if live is not None else await self._store.session_load(principal.tenant, answer_id)
        if state is None or state.input_items is None or not may_open(principal, state):
            raise NotFound(f"Response with id '{answer_id}' not found.")
        return state

    async def get(self, principal: Principal, answer_id: str) -> KeptAnswer:
        state = await self.state(principal, answer_id)
        assert state.input_items is not None
        if state.answer is not None:
            return KeptAnswer(state.answer, state.input_items)
        first = await self._first_event(principal.tenant, answer_id)
        surface = self._surfaces.named(state.surface)
        answer = surface.answer_of(first) if surface is not None else None
        if answer is None:
            raise StoreCorrupt("session state", answer_id, "a kept answer's first event carries no answer")
        return KeptAnswer(answer, state.input_items)

    async def _first_event(self, tenant: str, answer_id: str) -> bytes:
        """An answer in progress as it began. Its id reached the client in that first event, so
        the event is here or, streamed on another replica, in the store within a checkpoint."""
        deadline = time.monotonic() + self._patience_s
        while True:
            live = self._live.by_key.get((tenant, answer_id))
            if live is not None and live.log.events:
                return live.log.events[0][1]
            events = await self._store.session_events(tenant, answer_id, 0, 1)
            if events:
                return events[0][1]
            if time.monotonic() >= deadline:
                raise Conflict(f"Response '{answer_id}' has not started yet: ask again in a moment")
            await asyncio.sleep(TAIL_POLL_S)
