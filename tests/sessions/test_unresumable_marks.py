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
from gateway.sessions.unresumable import UNRESUMABLE, UnresumableMarks
from gateway.settings import EmbeddedStoreSettings, RedisStoreSettings, SessionSettings
from gateway.store.embedded import EmbeddedStore
from gateway.store.redis_store import RedisStore
from tests.store.test_redis_unavailable import free_port

ACME = Principal("key-1", "acme", frozenset({"chat"}), frozenset(), Limits())


def answered(session_id: str, request_id: str) -> RequestContext:
    ctx = RequestContext(request_id=request_id, completion_id=f"chatcmpl-{request_id}")
    ctx.principal, ctx.session_id = ACME, session_id
    return ctx


def tasks_named(name: str) -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name() == name]


async def test_a_store_that_is_down_holds_one_mark_a_session_and_one_writer() -> None:
    store = RedisStore(RedisStoreSettings(url=f"redis://127.0.0.1:{free_port()}/0", key_prefix="agw-test"))
    marks = UnresumableMarks(store, SessionSettings())
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
    marks = UnresumableMarks(store, SessionSettings())
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
    marks = UnresumableMarks(store, SessionSettings())
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
