"""The session part of the Store contract, run against both implementations (see conftest.backing).

Time: an embedded store's clock is moved forward; Redis expires keys by its own clock, so those
tests sleep past the TTL and then poll until a bounded deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

from gateway.store.base import SessionCheckpoint, Store
from gateway.store.session_record import SessionState
from tests.store.conftest import Backing

# Long enough that the step right after a short write lands before it lapses on a stalled machine.
SHORT_TTL = 1.0
LONG_TTL = 30.0
STATE = SessionState(
    "streaming", model="m1", body={"messages": [{"role": "user", "content": "héllo"}], "temperature": 1.5}, key_id="k1"
)
DONE = SessionState("done")


def opening(session_id: str, owner: str, *, new: bool = False) -> SessionCheckpoint:
    """What a replica's first write of a new answer is: claim the lease, save the state, drop the
    last answer's events (`session_open`)."""
    return SessionCheckpoint(
        "acme", session_id, LONG_TTL, state=STATE, renew_owner=owner, lease_ttl_s=LONG_TTL, replace_events=True, new=new
    )


def events(*seqs: int, tag: str = "") -> list[tuple[int, bytes]]:
    return [(seq, b'{"seq":%d,"tag":"%s"}' % (seq, tag.encode())) for seq in seqs]


async def let_pass(backing: Backing, seconds: float) -> None:
    if backing.clock is not None:
        backing.clock.advance(seconds)
    else:
        await asyncio.sleep(seconds)


async def eventually(backing: Backing, check: Callable[[], Awaitable[bool]], within_s: float = 5.0) -> None:
    """`check` holds now (embedded: the clock was moved) or soon (Redis: polled until a deadline)."""
    deadline = time.monotonic() + within_s
    while not await check():
        assert backing.clock is None, "the embedded store must not need real time to pass"
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.02)


# --- state --------------------------------------------------------------------------------


async def test_a_saved_state_is_loaded_back_and_replaced_by_the_next_save(store: Store) -> None:
    assert await store.session_load("acme", "s1") is None
    await store.session_save("acme", "s1", STATE, LONG_TTL)
    assert await store.session_load("acme", "s1") == STATE
    await store.session_save("acme", "s1", DONE, LONG_TTL)
    assert await store.session_load("acme", "s1") == DONE


async def test_a_kept_answers_items_and_answer_are_kept_and_read_back_field_for_field(store: Store) -> None:
    kept = SessionState(
        "done",
        key_id="k1",
        transcript=({"role": "user", "content": "héllo"}, {"role": "assistant", "content": "hi"}),
        surface="responses",
        input_items=({"id": "msg_1", "type": "message", "role": "user", "content": [{"type": "input_text"}]},),
        answer={"id": "resp_1", "object": "response", "status": "completed", "output": [{"id": "msg_2"}]},
    )
    await store.session_save("acme", "resp_1", kept, LONG_TTL)
    assert await store.session_load("acme", "resp_1") == kept
    assert (await store.session_load("acme", "resp_1") or DONE).kept


async def test_another_tenants_session_does_not_exist(store: Store) -> None:
    await store.session_save("acme", "s1", STATE, LONG_TTL)
    await store.session_append("acme", "s1", events(1, 2), LONG_TTL)
    assert await store.session_claim("acme", "s1", "replica-a", LONG_TTL)
    assert await store.session_load("globex", "s1") is None
    assert await store.session_events("globex", "s1", 0, 10) == []
    assert await store.session_claim("globex", "s1", "replica-b", LONG_TTL)
    assert await store.session_delete("globex", "s1")  # only globex's lease existed
    assert not await store.session_delete("globex", "s1")
    assert await store.session_load("acme", "s1") == STATE
    assert await store.session_events("acme", "s1", 0, 10) == events(1, 2)


async def test_tenant_and_session_ids_cannot_run_into_each_other(store: Store) -> None:
    await store.session_save("a:b", "c", SessionState("streaming", key_id="1"), LONG_TTL)
    await store.session_save("a", "b:c", SessionState("streaming", key_id="2"), LONG_TTL)
    await store.session_save("a}x{", "c}", SessionState("streaming", key_id="3"), LONG_TTL)
    assert await store.session_load("a:b", "c") == SessionState("streaming", key_id="1")
    assert await store.session_load("a", "b:c") == SessionState("streaming", key_id="2")
    assert await store.session_load("a}x{", "c}") == SessionState("streaming", key_id="3")
    assert await store.session_load("a", "b") is None


# --- events -------------------------------------------------------------------------------


async def test_events_are_read_after_a_seq_up_to_a_limit(store: Store) -> None:
    await store.session_append("acme", "s1", events(1, 2, 3), LONG_TTL)
    await store.session_append("acme", "s1", events(4, 5, 6, 7), LONG_TTL)
    assert await store.session_events("acme", "s1", 0, 100) == events(1, 2, 3, 4, 5, 6, 7)
    assert await store.session_events("acme", "s1", 2, 3) == events(3, 4, 5)
    assert await store.session_events("acme", "s1", 6, 100) == events(7)
    assert await store.session_events("acme", "s1", 7, 100) == []
    assert await store.session_events("acme", "s1", -5, 2) == events(1, 2)
    assert await store.session_events("acme", "s1", 0, 0) == []
    assert await store.session_events("acme", "nope", 0, 10) == []


async def test_a_re_appended_or_older_event_is_skipped(store: Store) -> None:
    await store.session_append("acme", "s1", events(1, 2, 3, tag="first"), LONG_TTL)
    await store.session_append("acme", "s1", events(2, 3, 4, 5, tag="retry"), LONG_TTL)
    await store.session_append("acme", "s1", events(1, 3, tag="late"), LONG_TTL)
    await store.session_append("acme", "s1", events(9, tag="gap"), LONG_TTL)  # gaps are allowed
    await store.session_append("acme", "s1", [], LONG_TTL)
    assert await store.session_events("acme", "s1", 0, 100) == [
        *events(1, 2, 3, tag="first"),
        *events(4, 5, tag="retry"),
        *events(9, tag="gap"),
    ]


async def test_events_of_a_session_never_saved_are_stored_but_it_does_not_load(store: Store) -> None:
    await store.session_append("acme", "s1", events(1), LONG_TTL)
    assert await store.session_load("acme", "s1") is None
    assert await store.session_events("acme", "s1", 0, 10) == events(1)
    await store.session_save("acme", "s1", STATE, LONG_TTL)
    assert await store.session_load("acme", "s1") == STATE
    assert await store.session_events("acme", "s1", 0, 10) == events(1)


async def test_payloads_are_kept_byte_for_byte(store: Store) -> None:
    payloads = [b"[DONE]", b"", bytes(range(256)), '{"c":"日本"}'.encode()]
    await store.session_append("acme", "s1", list(enumerate(payloads, start=1)), LONG_TTL)
    assert [p for _, p in await store.session_events("acme", "s1", 0, 10)] == payloads


async def test_bad_seqs_and_ttls_are_refused_before_anything_is_written(store: Store) -> None:
    with pytest.raises(ValueError, match="seqs"):
        await store.session_append("acme", "s1", [*events(1), (0, b"x")], LONG_TTL)
    with pytest.raises(ValueError, match="TTL"):
        await store.session_append("acme", "s1", events(1), 0)
    with pytest.raises(ValueError, match="TTL"):
        await store.session_save("acme", "s1", STATE, -1)
    with pytest.raises(ValueError, match="TTL"):
        await store.session_claim("acme", "s1", "replica-a", 0)
    assert await store.session_events("acme", "s1", 0, 10) == []
    assert not await store.session_delete("acme", "s1")


# --- lease --------------------------------------------------------------------------------


async def test_a_lease_is_refused_to_others_while_valid_and_granted_after_it_lapses(
    backing: Backing, store: Store
) -> None:
    assert await store.session_claim("acme", "s1", "replica-a", LONG_TTL)
    assert not await store.session_claim("acme", "s1", "replica-b", LONG_TTL)
    assert await store.session_claim("acme", "s1", "replica-a", SHORT_TTL)  # renewal sets the expiry
    assert not await store.session_claim("acme", "s1", "replica-b", LONG_TTL)
    await let_pass(backing, SHORT_TTL + 0.1)
    await eventually(backing, lambda: store.session_claim("acme", "s1", "replica-b", LONG_TTL))
    assert not await store.session_claim("acme", "s1", "replica-a", LONG_TTL)


async def test_a_renewed_lease_outlives_its_first_ttl(backing: Backing, store: Store) -> None:
    assert await store.session_claim("acme", "s1", "replica-a", SHORT_TTL)
    assert await store.session_claim("acme", "s1", "replica-a", 5.0)
    await let_pass(backing, SHORT_TTL * 2)
    assert not await store.session_claim("acme", "s1", "replica-b", 5.0)


async def test_only_the_holder_releases_a_lease(store: Store) -> None:
    await store.session_release("acme", "s1", "replica-a")  # nothing held: nothing happens
    assert await store.session_claim("acme", "s1", "replica-a", LONG_TTL)
    await store.session_release("acme", "s1", "replica-b")
    assert not await store.session_claim("acme", "s1", "replica-b", LONG_TTL)
    await store.session_release("acme", "s1", "replica-a")
    assert await store.session_claim("acme", "s1", "replica-b", LONG_TTL)


async def test_saving_and_appending_never_extend_a_lease(backing: Backing, store: Store) -> None:
    assert await store.session_claim("acme", "s1", "replica-a", SHORT_TTL)
    await store.session_save("acme", "s1", STATE, LONG_TTL)
    await store.session_append("acme", "s1", events(1), LONG_TTL)
    await let_pass(backing, SHORT_TTL + 0.1)
    await eventually(backing, lambda: store.session_claim("acme", "s1", "replica-b", LONG_TTL))
    assert await store.session_load("acme", "s1") == STATE


async def test_racing_claims_from_two_clients_grant_the_lease_once(backing: Backing, store: Store) -> None:
    clients = [store, backing.open()]
    claims = [clients[i % 2].session_claim("acme", "s1", f"replica-{i}", LONG_TTL) for i in range(20)]
    assert sum(await asyncio.gather(*claims)) == 1


# --- delete and expiry --------------------------------------------------------------------


async def test_deleting_removes_state_events_and_lease(store: Store) -> None:
    await store.session_save("acme", "s1", STATE, LONG_TTL)
    await store.session_append("acme", "s1", events(1, 2), LONG_TTL)
    assert await store.session_claim("acme", "s1", "replica-a", LONG_TTL)
    assert await store.session_delete("acme", "s1")
    assert await store.session_load("acme", "s1") is None
    assert await store.session_events("acme", "s1", 0, 10) == []
    assert not await store.session_delete("acme", "s1")
    assert await store.session_claim("acme", "s1", "replica-b", LONG_TTL)
    await store.session_append("acme", "s1", events(1, tag="new"), LONG_TTL)
    assert await store.session_events("acme", "s1", 0, 10) == events(1, tag="new")


async def test_a_session_expires_whole_and_starts_over_when_written_again(backing: Backing, store: Store) -> None:
    await store.session_save("acme", "s1", STATE, SHORT_TTL)
    await store.session_append("acme", "s1", events(1, 2, 3), SHORT_TTL)
    assert await store.session_load("acme", "s1") == STATE
    await let_pass(backing, SHORT_TTL + 0.1)

    async def gone() -> bool:
        return await store.session_load("acme", "s1") is None and not await store.session_events("acme", "s1", 0, 10)

    await eventually(backing, gone)
    assert not await store.session_delete("acme", "s1")
    await store.session_append("acme", "s1", events(1, tag="again"), LONG_TTL)
    assert await store.session_events("acme", "s1", 0, 10) == events(1, tag="again")
    assert await store.session_load("acme", "s1") is None


async def test_saving_or_appending_refreshes_the_whole_sessions_ttl(backing: Backing, store: Store) -> None:
    await store.session_append("acme", "s1", events(1), SHORT_TTL)
    await store.session_save("acme", "s1", STATE, LONG_TTL)
    await store.session_save("acme", "s2", STATE, SHORT_TTL)
    await store.session_append("acme", "s2", events(1), LONG_TTL)
    await let_pass(backing, SHORT_TTL * 2)
    assert await store.session_events("acme", "s1", 0, 10) == events(1)
    assert await store.session_load("acme", "s2") == STATE


async def test_a_shorter_session_ttl_cuts_the_lease_with_it(backing: Backing, store: Store) -> None:
    assert await store.session_claim("acme", "s1", "replica-a", LONG_TTL)
    await store.session_save("acme", "s1", STATE, SHORT_TTL)
    await let_pass(backing, SHORT_TTL + 0.1)
    await eventually(backing, lambda: store.session_claim("acme", "s1", "replica-b", LONG_TTL))


# --- several clients ----------------------------------------------------------------------


async def test_a_session_written_by_one_client_is_read_by_another(backing: Backing, store: Store) -> None:
    await store.session_load("acme", "warm-up")  # the reader's connection is open before the write
    writer = backing.open()
    await writer.session_save("acme", "s1", STATE, LONG_TTL)
    await writer.session_append("acme", "s1", events(1, 2), LONG_TTL)
    assert await store.session_load("acme", "s1") == STATE
    assert await store.session_events("acme", "s1", 1, 10) == events(2)


async def test_overlapping_flushes_from_two_clients_never_duplicate(backing: Backing, store: Store) -> None:
    clients = [store, backing.open()]
    batches = [events(*range(start, start + 5)) for start in range(1, 60, 3)]
    await asyncio.gather(*(clients[i % 2].session_append("acme", "s1", b, LONG_TTL) for i, b in enumerate(batches)))
    seqs = [seq for seq, _ in await store.session_events("acme", "s1", 0, 1000)]
    assert seqs == sorted(set(seqs))
    assert seqs[-1] == 62  # whatever order the batches landed in


async def test_a_batched_checkpoint_saves_appends_and_moves_leases_for_many_sessions(store: Store) -> None:
    await store.session_claim("t1", "done", "replica-a", LONG_TTL)
    await store.session_checkpoint(
        [
            SessionCheckpoint(
                "t1", "live", LONG_TTL, state=STATE, events=events(1, 2), renew_owner="replica-a", lease_ttl_s=LONG_TTL
            ),
            SessionCheckpoint("t1", "done", LONG_TTL, state=DONE, events=events(1), release_owner="replica-a"),
            SessionCheckpoint("t2", "live", LONG_TTL, events=events(1, 2, 3)),
        ]
    )
    assert await store.session_load("t1", "live") == STATE
    assert [seq for seq, _ in await store.session_events("t1", "live", 0, 10)] == [1, 2]
    assert [seq for seq, _ in await store.session_events("t2", "live", 0, 10)] == [1, 2, 3]
    assert not await store.session_claim("t1", "live", "replica-b", LONG_TTL), "the lease was taken for replica-a"
    assert await store.session_claim("t1", "done", "replica-b", LONG_TTL), "the finished session's lease was released"
    await store.session_checkpoint([SessionCheckpoint("t1", "live", LONG_TTL, events=events(2, 3))])
    assert [seq for seq, _ in await store.session_events("t1", "live", 0, 10)] == [1, 2, 3], "no duplicate on retry"
    await store.session_checkpoint([])


async def test_opening_a_session_claims_it_saves_the_state_and_drops_the_last_answers_events(store: Store) -> None:

    await store.session_save("acme", "s1", DONE, LONG_TTL)
    await store.session_append("acme", "s1", events(1, 2, tag="last answer"), LONG_TTL)
    first = opening("s1", "replica-a")
    assert await store.session_open(first)
    assert await store.session_load("acme", "s1") == STATE
    assert await store.session_events("acme", "s1", 0, 10) == []
    assert not await store.session_claim("acme", "s1", "replica-b", LONG_TTL), "the lease is replica-a's"
    assert await store.session_open(first), "the owner may open its own session again"


async def test_opening_a_session_another_owner_streams_writes_nothing(store: Store) -> None:

    await store.session_save("acme", "s1", DONE, LONG_TTL)
    await store.session_append("acme", "s1", events(1, 2), LONG_TTL)
    assert await store.session_claim("acme", "s1", "replica-a", LONG_TTL)
    assert not await store.session_open(opening("s1", "replica-b"))
    assert await store.session_load("acme", "s1") == DONE
    assert await store.session_events("acme", "s1", 0, 10) == events(1, 2)


async def test_a_session_opened_as_new_is_owned_saved_and_continued_like_any_other(store: Store) -> None:
    assert await store.session_open(opening("sess_new", "replica-a", new=True))
    assert await store.session_load("acme", "sess_new") == STATE
    assert await store.session_events("acme", "sess_new", 0, 10) == []
    assert not await store.session_claim("acme", "sess_new", "replica-b", LONG_TTL), "the lease is replica-a's"
    await store.session_checkpoint(
        [SessionCheckpoint("acme", "sess_new", LONG_TTL, state=DONE, events=events(1, 2), release_owner="replica-a")]
    )
    assert await store.session_load("acme", "sess_new") == DONE
    assert [seq for seq, _ in await store.session_events("acme", "sess_new", 0, 10)] == [1, 2]
    assert await store.session_claim("acme", "sess_new", "replica-b", LONG_TTL), "released by the last checkpoint"


async def test_new_is_only_a_hint_a_session_that_exists_is_opened_or_refused_as_ever(store: Store) -> None:

    await store.session_save("acme", "s1", DONE, LONG_TTL)
    await store.session_append("acme", "s1", events(1, 2), LONG_TTL)
    assert await store.session_claim("acme", "s1", "replica-a", LONG_TTL)

    assert not await store.session_open(opening("s1", "replica-b", new=True)), "replica-a streams it"
    assert await store.session_load("acme", "s1") == DONE
    assert await store.session_open(opening("s1", "replica-a", new=True))
    assert await store.session_load("acme", "s1") == STATE
    assert await store.session_events("acme", "s1", 0, 10) == [], "the last answer's events dropped as ever"


async def test_opening_a_session_without_an_owner_is_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="owner"):
        await store.session_open(SessionCheckpoint("acme", "s1", LONG_TTL, state=STATE, lease_ttl_s=LONG_TTL))


async def test_racing_opens_grant_a_session_to_one_owner_and_open_every_other_session(store: Store) -> None:

    contested = [store.session_open(opening("shared", f"replica-{n}")) for n in range(10)]
    own = [store.session_open(opening(f"own-{n}", "replica-a")) for n in range(10)]
    results = await asyncio.gather(*contested, *own)
    assert sum(results[:10]) == 1
    assert all(results[10:])
    assert all([await store.session_load("acme", f"own-{n}") == STATE for n in range(10)])
