"""Sessions answered while the store is down wait to be marked unresumable: one entry a session
(its latest answer), at most MAX_MARKS of them, and one task writing them when the store is back;
never a task an answer (a long outage under load made tens of thousands of retrying tasks)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.core.principal import Limits, Principal
from gateway.pipeline import RequestContext
from gateway.sessions import unresumable
from gateway.sessions.checkpointer import Checkpointer
from gateway.sessions.event_log import SessionLog
from gateway.sessions.live import LiveSession, LiveSessions
from gateway.sessions.unresumable import UNRESUMABLE, UnresumableMarks
from gateway.settings import EmbeddedStoreSettings, RedisStoreSettings, SessionSettings
from gateway.store.embedded import EmbeddedStore
from gateway.store.redis_store import RedisStore
from gateway.store.session_record import SessionState
from gateway.surfaces.chat_completions import ChatCompletions
from tests.store.test_redis_unavailable import free_port

ACME = Principal("key-1", "acme", frozenset({"chat"}), frozenset(), Limits())


def answered(session_id: str, request_id: str) -> RequestContext:
    ctx = RequestContext(request_id=request_id, completion_id=f"chatcmpl-{request_id}", surface=ChatCompletions())
    ctx.principal, ctx.session_id = ACME, session_id
    return ctx


def tasks_named(name: str) -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name() == name]


async def test_a_store_that_is_down_holds_one_mark_a_session_and_one_writer() -> None:
    store = RedisStore(RedisStoreSettings(url=f"redis://127.0.0.1:{free_port()}/0", key_prefix="agw-test"))
    marks = UnresumableMarks(store, SessionSettings(), LiveSessions())
    try:
        for n in range(50):
            marks.mark(answered(f"s{n % 5}", f"r{n}"))
        assert len(marks._marks) == 5
        assert marks._marks[("acme", "s0")].answer.request_id == "r45"  # the latest answer of each
        assert len(tasks_named("session-marks")) == 1
    finally:
        await marks.drain()
        await store.aclose()
    assert not tasks_named("session-marks")


async def test_past_the_cap_a_mark_is_dropped_and_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(unresumable, "MAX_MARKS", 3)
    store = RedisStore(RedisStoreSettings(url=f"redis://127.0.0.1:{free_port()}/0", key_prefix="agw-test"))
    marks = UnresumableMarks(store, SessionSettings(), LiveSessions())
    try:
        for n in range(5):
            marks.mark(answered(f"s{n}", f"r{n}"))
        marks.mark(answered("s0", "r9"))  # a session already waiting is still brought up to date
        assert sorted(s for _, s in marks._marks) == ["s0", "s1", "s2"]
        assert marks._marks[("acme", "s0")].answer.request_id == "r9"
        assert marks.dropped == 2
    finally:
        await marks.drain()
        await store.aclose()


async def test_marks_are_written_when_the_store_answers(tmp_path: Path) -> None:
    store = EmbeddedStore(EmbeddedStoreSettings(path=tmp_path))
    marks = UnresumableMarks(store, SessionSettings(), LiveSessions())
    try:
        marks.mark(answered("s1", "r1"))
        assert marks._writer is not None
        await asyncio.wait_for(marks._writer, 10)  # it ends once every mark is written
        assert not marks._marks
        state = await store.session_load("acme", "s1")
        assert state is not None
        assert (state.status, state.request_id) == (UNRESUMABLE, "r1")
    finally:
        await marks.drain()
        await store.aclose()


async def test_a_mark_is_not_overwritten_by_the_earlier_answers_late_checkpoint(tmp_path: Path) -> None:
    """The answer before the outage ended but its last checkpoint was still to be written when the
    store went away; the store comes back. Its late checkpoint must not land over the mark, or a
    resume replays that earlier answer (tests/chaos/test_redis_down_sessions.py, 1 run in 3)."""
    store = EmbeddedStore(EmbeddedStoreSettings(path=tmp_path))
    settings = SessionSettings()
    live = LiveSessions()
    earlier = SessionLog()
    earlier.append(b'data: {"earlier": true}\n\n')
    earlier.close()
    state = SessionState(request_id="r1", completion_id="chatcmpl-r1", created=1, key_id="key-1", status="streaming")
    live.by_key[("acme", "s1")] = LiveSession("acme", "s1", earlier, state, ChatCompletions())
    marks = UnresumableMarks(store, settings, live)
    checkpointer = Checkpointer(store, settings, "replica-a", live)
    try:
        marks.mark(answered("s1", "r2"))
        assert marks._writer is not None
        # The mark's writer gets the store first, as it may when the store is back; it is given
        # a second to write (not a verdict: a writer that waits for the checkpoint waits it out).
        await asyncio.wait({marks._writer}, timeout=1.0)
        await checkpointer.checkpoint_all()
        await asyncio.wait_for(marks._writer, 10)
        saved = await store.session_load("acme", "s1")
        assert saved is not None
        assert (saved.status, saved.request_id) == (UNRESUMABLE, "r2")
    finally:
        await marks.drain()
        await store.aclose()
