"""The session stages on their own, over the embedded store: naming a session, putting its
transcript in front of an appending request, who may open it, and a store outage."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.core.chunks import Chunk
from gateway.core.principal import Limits, Principal
from gateway.errors import InvalidRequest, NotFound, StoreUnavailable
from gateway.pipeline import RequestContext, compose
from gateway.sessions.stage import AppendHistory, AssignSession
from gateway.settings import EmbeddedStoreSettings, SessionSettings, SessionStoreFailMode
from gateway.store.embedded import EmbeddedStore
from gateway.store.session_record import SessionState
from gateway.surfaces.chat_completions import ChatCompletions

ALICE = Principal("key_alice", "acme", frozenset({"chat"}), frozenset(), Limits())
BOB = Principal("key_bob", "acme", frozenset({"chat"}), frozenset(), Limits())
EARLIER = ({"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"})
NEW = {"role": "user", "content": "and now?"}


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EmbeddedStore]:
    store = EmbeddedStore(EmbeddedStoreSettings(path=tmp_path))
    yield store
    await store.aclose()


def request_of(principal: Principal, headers: dict[str, str]) -> RequestContext:
    ctx = RequestContext("r", "c", ChatCompletions(), headers=headers, model="m", body={"messages": [NEW]})
    ctx.principal = principal
    return ctx


async def through(
    store: EmbeddedStore, ctx: RequestContext, on_store_error: SessionStoreFailMode = SessionStoreFailMode.CLOSED
) -> list[dict[str, Any]]:
    """The messages the call behind the stages was asked with."""
    seen: list[dict[str, Any]] = []

    async def call(ctx: RequestContext) -> AsyncGenerator[Chunk, None]:
        seen.extend(ctx.body["messages"])
        yield Chunk(content="ok")

    path = compose(
        [AssignSession(SessionSettings()), AppendHistory(store, SessionSettings(on_store_error=on_store_error))], call
    )
    assert [chunk.content async for chunk in path(ctx)] == ["ok"]
    return seen


async def save(store: EmbeddedStore, session_id: str, owner: str, shared: bool = False) -> None:
    state = SessionState("done", key_id=owner, shared=shared, transcript=EARLIER)
    await store.session_save("acme", session_id, state, 3600)


async def test_a_request_without_a_session_gets_a_new_id_and_keeps_no_transcript(store: EmbeddedStore) -> None:
    ctx = request_of(ALICE, {})
    await through(store, ctx)
    assert (ctx.session_id or "").startswith("sess_")
    assert (ctx.session_new, ctx.keep_transcript) == (True, False)
    assert ctx.response_headers["X-Session-Id"] == ctx.session_id


async def test_a_malformed_session_id_is_a_400_naming_the_header(store: EmbeddedStore) -> None:
    with pytest.raises(InvalidRequest) as refused:
        await through(store, request_of(ALICE, {"x-session-id": "no spaces allowed"}))
    assert refused.value.param == "X-Session-Id"


async def test_an_appending_request_is_sent_with_the_sessions_transcript_in_front(store: EmbeddedStore) -> None:
    await save(store, "s1", owner=ALICE.key_id)
    headers = {"x-session-id": "s1", "x-session-append": "true"}
    assert await through(store, request_of(ALICE, headers)) == [*EARLIER, NEW]


async def test_another_keys_session_is_not_found_unless_shared_with_the_tenant(store: EmbeddedStore) -> None:
    await save(store, "private", owner=ALICE.key_id)
    await save(store, "shared", owner=ALICE.key_id, shared=True)
    with pytest.raises(NotFound):
        await through(store, request_of(BOB, {"x-session-id": "private", "x-session-append": "true"}))
    ctx = request_of(BOB, {"x-session-id": "shared", "x-session-append": "true"})
    assert await through(store, ctx) == [*EARLIER, NEW]
    assert (ctx.session_owner, ctx.session_shared) == (ALICE.key_id, True)


async def test_only_the_owner_changes_who_may_use_a_session(store: EmbeddedStore) -> None:
    await save(store, "shared", owner=ALICE.key_id, shared=True)
    by_bob = request_of(BOB, {"x-session-id": "shared", "x-session-share": "key"})
    await through(store, by_bob)
    assert by_bob.session_shared, "not Bob's to make private"
    by_alice = request_of(ALICE, {"x-session-id": "shared", "x-session-share": "key"})
    await through(store, by_alice)
    assert not by_alice.session_shared


async def test_with_the_store_down_a_plain_request_is_served_unresumable_and_an_appending_one_refused(
    store: EmbeddedStore,
) -> None:
    await store.aclose()
    serve = SessionStoreFailMode.SERVE_UNRESUMABLE
    ctx = request_of(ALICE, {"x-session-id": "s1"})
    assert await through(store, ctx, serve) == [NEW]
    assert ctx.session_unresumable
    assert ctx.response_headers["X-Session-Resumable"] == "false"
    with pytest.raises(StoreUnavailable):
        await through(store, request_of(ALICE, {"x-session-id": "s1", "x-session-append": "true"}), serve)
    with pytest.raises(StoreUnavailable):
        await through(store, request_of(ALICE, {"x-session-id": "s1"}))  # fail_closed
