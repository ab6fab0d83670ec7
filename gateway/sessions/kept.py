"""Kept answers: a surface's answer kept as an object of its own (a Responses response with
`store: true`), retrieved by its id. A kept answer is a session named by the answer's id, so it
has everything a session has: its owner and sharing, its stream's resume and takeover, its
expiry (`kept_answer_ttl_s`). What it adds is kept in its state: its input items and, once it
ended, the answer as its client last saw it (`SessionState.input_items`, `.answer`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.core.chunks import Chunk
from gateway.core.principal import Principal
from gateway.core.surface import AnswerHead, Surface, Surfaces
from gateway.errors import NotFound, StoreCorrupt
from gateway.sessions.live import LiveSessions, may_open
from gateway.store.base import SessionStore
from gateway.store.session_record import SessionState


@dataclass(frozen=True, slots=True)
class KeptAnswer:
    answer: dict[str, Any]  # as its client last saw it; an answer still being made, as it began
    input_items: tuple[dict[str, Any], ...]


class KeptAnswers:
    def __init__(self, store: SessionStore, live: LiveSessions, surfaces: Surfaces) -> None:
        self._store = store
        self._live = live
        self._surfaces = surfaces

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
        surface = self._surfaces.named(state.surface)
        first = await self._first_event(principal.tenant, answer_id)
        answer = None if surface is None else surface.answer_of(first) if first is not None else _begun(surface, state)
        if answer is None:
            raise StoreCorrupt("session state", answer_id, "a kept answer's first event carries no answer")
        return KeptAnswer(answer, state.input_items)

    async def _first_event(self, tenant: str, answer_id: str) -> bytes | None:
        live = self._live.by_key.get((tenant, answer_id))
        if live is not None and live.log.events:
            return live.log.events[0][1]
        events = await self._store.session_events(tenant, answer_id, 0, 1)
        return events[0][1] if events else None


def _begun(surface: Surface, state: SessionState) -> dict[str, Any] | None:
    """An answer in progress of which no event was checkpointed (its replica died at once, or its
    first checkpoint is on the way): what its writer's first events would say."""
    head = AnswerHead(
        state.completion_id or "", state.created or 0, state.model or "", state.include_usage, echo=state.echo or {}
    )
    for payload in surface.writer(head).chunk(Chunk()):
        answer = surface.answer_of(payload)
        if answer is not None:
            return answer
    return None
