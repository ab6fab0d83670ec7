"""The approval part of the Store contract, run against both implementations (see conftest.backing).

Time: an embedded store's clock is moved forward; Redis judges expiry by its own clock (the
machine's, as the tests'), so those tests either build records that have already lapsed or sleep.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import pytest

from gateway.store.approval_record import Approval, Decision, PendingCaps
from gateway.store.base import Store
from tests.store.conftest import Backing
from tests.store.helpers import approval_record
from tests.store.test_sessions_contract import eventually, let_pass

RETAIN = 3600.0
# Long enough that a loaded machine (or a cluster hop) cannot pass it between a put and the
# read that checks the record is still pending; real-clock stores really wait this long.
SHORT = 1.5


def now(backing: Backing) -> float:
    """The store's clock, as a record's times are measured."""
    return backing.clock() if backing.clock is not None else time.time()


def approve(by: str = "alice", token: str | None = None) -> Decision:
    return Decision("approved", decided_by=by, decided_at=time.time(), decision_reason="ok", token=token)


def reject(by: str = "bob") -> Decision:
    return Decision("rejected", decided_by=by, decided_at=time.time(), decision_reason="no")


def expired(record: Approval) -> Approval:
    return dataclasses.replace(record, status="expired")


# --- put and get --------------------------------------------------------------------------


async def test_a_put_approval_reads_back_field_for_field(backing: Backing, store: Store) -> None:
    record = approval_record("a1", requested_at=now(backing))
    await store.approval_put(record, RETAIN)
    assert await store.approval_get("acme", "a1") == record
    assert await store.approval_get("acme", "a2") is None


async def test_another_tenants_approval_does_not_exist(backing: Backing, store: Store) -> None:
    record = approval_record("a1", requested_at=now(backing))
    await store.approval_put(record, RETAIN)
    assert await store.approval_get("globex", "a1") is None
    assert await store.approval_decide("globex", "a1", approve()) == (False, None)
    assert await store.approval_list("globex", None, 10) == []
    assert await store.approval_get("acme", "a1") == record


async def test_tenants_and_ids_cannot_run_into_each_other(backing: Backing, store: Store) -> None:
    first = approval_record("c", tenant="a:b", requested_at=now(backing))
    second = approval_record("b:c", tenant="a", requested_at=now(backing))
    third = approval_record("c}{", tenant="a}x", requested_at=now(backing))
    for record in (first, second, third):
        await store.approval_put(record, RETAIN)
    assert await store.approval_get("a:b", "c") == first
    assert await store.approval_get("a", "b:c") == second
    assert await store.approval_get("a}x", "c}{") == third
    assert await store.approval_get("a", "b") is None
    assert await store.approval_list("a", None, 10) == [second]


async def test_putting_an_existing_approval_again_changes_nothing(backing: Backing, store: Store) -> None:
    record = approval_record("a1", requested_at=now(backing))
    await store.approval_put(record, RETAIN)
    won, decided = await store.approval_decide("acme", "a1", approve())
    assert won
    await store.approval_put(dataclasses.replace(record, tool="other"), RETAIN)
    assert await store.approval_get("acme", "a1") == decided


# --- decide -------------------------------------------------------------------------------


async def test_a_decision_is_merged_into_the_record_once(backing: Backing, store: Store) -> None:
    record = approval_record("a1", requested_at=now(backing))
    await store.approval_put(record, RETAIN)
    decision = approve(token="tok-123")
    won, decided = await store.approval_decide("acme", "a1", decision)
    assert won
    assert decided == record.decided(decision)
    assert await store.approval_get("acme", "a1") == decided
    assert await store.approval_decide("acme", "a1", reject()) == (False, decided)
    assert await store.approval_decide("acme", "a1", approve("mallory")) == (False, decided)


async def test_deciding_an_unknown_approval_changes_nothing(store: Store) -> None:
    assert await store.approval_decide("acme", "nope", approve()) == (False, None)
    assert await store.approval_get("acme", "nope") is None


async def test_of_concurrent_decisions_exactly_one_wins(backing: Backing, store: Store) -> None:
    await store.approval_put(approval_record("a1", requested_at=now(backing)), RETAIN)
    decisions = [approve(f"approver-{i}") if i % 2 else reject(f"approver-{i}") for i in range(20)]
    results = await asyncio.gather(*(store.approval_decide("acme", "a1", d) for d in decisions))
    assert sum(won for won, _ in results) == 1
    stored = await store.approval_get("acme", "a1")
    assert all(record == stored for _, record in results)


async def test_of_decisions_from_two_clients_exactly_one_wins(backing: Backing, store: Store) -> None:
    clients = [store, backing.open()]
    await clients[1].approval_put(approval_record("a1", requested_at=now(backing)), RETAIN)
    calls = [clients[i % 2].approval_decide("acme", "a1", approve(f"approver-{i}")) for i in range(20)]
    results = await asyncio.gather(*calls)
    assert sum(won for won, _ in results) == 1
    winner = next(record for won, record in results if won)
    assert await clients[0].approval_get("acme", "a1") == winner
    assert await clients[1].approval_get("acme", "a1") == winner


# --- pending caps -------------------------------------------------------------------------


async def test_a_capped_put_refuses_past_the_keys_cap_and_stores_nothing(backing: Backing, store: Store) -> None:
    at = now(backing)
    caps = PendingCaps(per_key=2, per_tenant=10)
    assert await store.approval_put_within(approval_record("a1", requested_at=at), RETAIN, caps) is None
    assert await store.approval_put_within(approval_record("a2", requested_at=at), RETAIN, caps) is None
    assert await store.approval_put_within(approval_record("a3", requested_at=at), RETAIN, caps) == "key"
    assert await store.approval_get("acme", "a3") is None
    # Another key of the tenant, and another tenant, are not held back by this key's cap.
    other_key = approval_record("b1", requested_at=at, key_id="k2")
    assert await store.approval_put_within(other_key, RETAIN, caps) is None
    assert await store.approval_put_within(approval_record("g1", "globex", requested_at=at), RETAIN, caps) is None
    # A retried put of a live approval is no new approval: it changes nothing and is not refused.
    assert await store.approval_put_within(approval_record("a1", requested_at=at), RETAIN, caps) is None


async def test_a_capped_put_refuses_past_the_tenants_cap(backing: Backing, store: Store) -> None:
    at = now(backing)
    caps = PendingCaps(per_key=5, per_tenant=3)
    for i in range(3):
        record = approval_record(f"a{i}", requested_at=at, key_id=f"k{i}")
        assert await store.approval_put_within(record, RETAIN, caps) is None
    refused = approval_record("a9", requested_at=at, key_id="k9")
    assert await store.approval_put_within(refused, RETAIN, caps) == "tenant"
    assert await store.approval_get("acme", "a9") is None
    assert await store.approval_put_within(approval_record("g1", "globex", requested_at=at), RETAIN, caps) is None


async def test_decided_and_lapsed_approvals_are_not_pending(backing: Backing, store: Store) -> None:
    at = now(backing)
    caps = PendingCaps(per_key=1, per_tenant=1)
    await store.approval_put(approval_record("old", requested_at=at - 120), RETAIN)  # lapsed a minute ago
    assert await store.approval_put_within(approval_record("a1", requested_at=at), RETAIN, caps) is None
    assert await store.approval_put_within(approval_record("a2", requested_at=at), RETAIN, caps) == "key"
    assert (await store.approval_decide("acme", "a1", reject()))[0]
    assert await store.approval_put_within(approval_record("a2", requested_at=at), RETAIN, caps) is None


async def test_a_tenant_with_many_decided_approvals_is_capped_on_its_pending_ones_only(
    backing: Backing, store: Store
) -> None:
    """The count is of pending approvals, not of the retention kept for the audit trail (which
    once made every capped put on Redis read all of them)."""
    at = now(backing)
    caps = PendingCaps(per_key=2, per_tenant=3)
    for i in range(300):
        assert await store.approval_put_within(approval_record(f"d{i}", requested_at=at), RETAIN, caps) is None
        assert (await store.approval_decide("acme", f"d{i}", approve() if i % 2 else reject()))[0]
    assert await store.approval_put_within(approval_record("a1", requested_at=at), RETAIN, caps) is None
    assert await store.approval_put_within(approval_record("a2", requested_at=at), RETAIN, caps) is None
    assert await store.approval_put_within(approval_record("a3", requested_at=at), RETAIN, caps) == "key"
    other = approval_record("b1", requested_at=at, key_id="k2")
    assert await store.approval_put_within(other, RETAIN, caps) is None
    assert (
        await store.approval_put_within(approval_record("b2", requested_at=at, key_id="k3"), RETAIN, caps) == "tenant"
    )


async def test_racing_capped_puts_from_two_clients_never_pass_the_cap(backing: Backing, store: Store) -> None:
    clients = [store, backing.open()]
    at = now(backing)
    caps = PendingCaps(per_key=3, per_tenant=100)
    puts = [
        clients[i % 2].approval_put_within(approval_record(f"a{i}", requested_at=at), RETAIN, caps) for i in range(20)
    ]
    answers = await asyncio.gather(*puts)
    assert answers.count(None) == 3
    assert answers.count("key") == 17
    assert len(await store.approval_list("acme", "pending", 100)) == 3


# --- expiry -------------------------------------------------------------------------------


async def test_a_lapsed_approval_reads_as_expired_and_cannot_be_decided(backing: Backing, store: Store) -> None:
    record = approval_record("a1", requested_at=now(backing) - 120)  # expired a minute ago
    await store.approval_put(record, RETAIN)
    lapsed = expired(record)
    assert await store.approval_get("acme", "a1") == lapsed
    assert await store.approval_decide("acme", "a1", approve()) == (False, lapsed)
    assert await store.approval_get("acme", "a1") == lapsed


async def test_a_pending_approval_expires_when_its_time_passes(backing: Backing, store: Store) -> None:
    start = now(backing)
    record = approval_record("a1", requested_at=start, expires_at=start + SHORT)
    await store.approval_put(record, RETAIN)
    assert getattr(await store.approval_get("acme", "a1"), "status", None) == "pending"
    await let_pass(backing, SHORT + 0.1)

    async def lapsed() -> bool:
        return getattr(await store.approval_get("acme", "a1"), "status", None) == "expired"

    await eventually(backing, lapsed)
    assert await store.approval_decide("acme", "a1", approve()) == (False, expired(record))


async def test_a_decided_approval_stays_decided_past_its_expiry(backing: Backing, store: Store) -> None:
    start = now(backing)
    await store.approval_put(approval_record("a1", requested_at=start, expires_at=start + SHORT), RETAIN)
    won, decided = await store.approval_decide("acme", "a1", reject())
    assert won
    await let_pass(backing, SHORT + 0.1)
    assert await store.approval_get("acme", "a1") == decided
    assert await store.approval_list("acme", "rejected", 10) == [decided]


async def test_an_approval_is_forgotten_its_retention_after_expiry(backing: Backing, store: Store) -> None:
    start = now(backing)
    record = approval_record("a1", requested_at=start, expires_at=start + SHORT)
    await store.approval_put(record, SHORT)
    await let_pass(backing, 2 * SHORT + 0.1)

    async def forgotten() -> bool:
        return await store.approval_get("acme", "a1") is None

    await eventually(backing, forgotten)
    assert await store.approval_list(None, None, 10) == []
    assert await store.approval_decide("acme", "a1", approve()) == (False, None)
    again = approval_record("a1", requested_at=now(backing), tool="again")
    await store.approval_put(again, RETAIN)  # a forgotten id can be used again
    assert await store.approval_get("acme", "a1") == again


async def test_an_approval_past_its_retention_is_not_kept(backing: Backing, store: Store) -> None:
    await store.approval_put(approval_record("a1", requested_at=now(backing) - 1000), 10)
    assert await store.approval_get("acme", "a1") is None
    assert await store.approval_list("acme", None, 10) == []


# --- listing ------------------------------------------------------------------------------


async def decided(store: Store, tenant: str, approval_id: str, decision: Decision) -> Approval:
    won, record = await store.approval_decide(tenant, approval_id, decision)
    assert won
    assert record is not None
    return record


async def fill(backing: Backing, store: Store) -> dict[str, Approval]:
    """Six approvals of two tenants, one second apart (a1 oldest): a1 lapsed, a2 approved,
    a3 rejected, the others pending."""
    base = now(backing) - 10
    records = {
        "a1": approval_record("a1", requested_at=base - 100),
        "a2": approval_record("a2", requested_at=base + 2),
        "g3": approval_record("g3", tenant="globex", requested_at=base + 3),
        "a4": approval_record("a4", requested_at=base + 4),
        "g5": approval_record("g5", tenant="globex", requested_at=base + 5),
        "a6": approval_record("a6", requested_at=base + 6),
    }
    for record in records.values():
        await store.approval_put(record, RETAIN)
    records["a1"] = expired(records["a1"])
    records["a2"] = await decided(store, "acme", "a2", approve())
    records["g3"] = await decided(store, "globex", "g3", reject())
    return records


async def test_approvals_are_listed_newest_first_per_tenant_or_all(backing: Backing, store: Store) -> None:
    records = await fill(backing, store)
    every = ["a6", "g5", "a4", "g3", "a2", "a1"]
    assert await store.approval_list(None, None, 100) == [records[i] for i in every]
    assert await store.approval_list(None, None, 2) == [records["a6"], records["g5"]]
    assert await store.approval_list("acme", None, 100) == [records[i] for i in ("a6", "a4", "a2", "a1")]
    assert await store.approval_list("globex", None, 1) == [records["g5"]]
    assert await store.approval_list("initech", None, 10) == []
    assert await store.approval_list(None, None, 0) == []


async def test_the_status_filter_sees_lapsed_approvals_as_expired(backing: Backing, store: Store) -> None:
    records = await fill(backing, store)
    assert await store.approval_list(None, "pending", 100) == [records[i] for i in ("a6", "g5", "a4")]
    assert await store.approval_list("acme", "pending", 1) == [records["a6"]]
    assert await store.approval_list(None, "expired", 100) == [records["a1"]]
    assert await store.approval_list(None, "approved", 100) == [records["a2"]]
    assert await store.approval_list("acme", "rejected", 100) == []
    assert await store.approval_list("globex", "rejected", 100) == [records["g3"]]


async def test_a_status_filter_finds_matches_beyond_many_others(backing: Backing, store: Store) -> None:
    base = now(backing)
    for i in range(250):  # more than one chunk of a Redis listing
        await store.approval_put(approval_record(f"p{i:03}", requested_at=base + i), RETAIN)
    old = approval_record("old", requested_at=base - 1000)
    await store.approval_put(old, RETAIN)
    assert await store.approval_list("acme", "expired", 10) == [expired(old)]
    listed = await store.approval_list(None, "pending", 200)
    assert [r.id for r in listed] == [f"p{i:03}" for i in range(249, 49, -1)]


# --- bad arguments ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "ttl", "match"),
    [
        ({"status": "approved"}, RETAIN, "pending"),
        ({"id": ""}, RETAIN, "id"),
        ({"tenant": ""}, RETAIN, "tenant"),
        ({"expires_at": float("inf")}, RETAIN, "expires_at"),
        ({"requested_at": float("nan")}, RETAIN, "requested_at"),
        ({}, 0, "retention"),
        ({}, float("inf"), "retention"),
    ],
)
async def test_a_bad_approval_is_refused_before_anything_is_written(
    backing: Backing, store: Store, changes: dict[str, Any], ttl: float, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        await store.approval_put(dataclasses.replace(approval_record("a1", requested_at=now(backing)), **changes), ttl)
    assert await store.approval_list(None, None, 10) == []


@pytest.mark.parametrize(
    ("decision", "match"),
    [
        (Decision("lost"), "status"),
        (Decision("pending", decided_by="alice"), "status"),
    ],
)
async def test_a_bad_decision_is_refused_before_anything_is_written(
    backing: Backing, store: Store, decision: Decision, match: str
) -> None:
    record = approval_record("a1", requested_at=now(backing))
    await store.approval_put(record, RETAIN)
    with pytest.raises(ValueError, match=match):
        await store.approval_decide("acme", "a1", decision)
    assert await store.approval_get("acme", "a1") == record


async def test_an_unknown_status_filter_is_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="status"):
        await store.approval_list(None, "lost", 10)


# --- expiring and redeeming ----------------------------------------------------------------


async def test_the_gateway_can_expire_a_pending_approval_once(backing: Backing, store: Store) -> None:
    record = approval_record("a1", requested_at=now(backing))
    await store.approval_put(record, RETAIN)
    ended = Decision("expired", decided_by="gateway", decision_reason="the wait ended")
    won, stored = await store.approval_decide("acme", "a1", ended)
    assert won
    assert stored is not None
    assert stored.status == "expired"
    assert (await store.approval_decide("acme", "a1", approve()))[0] is False, "an expired approval stays expired"
    assert [r.id for r in await store.approval_list("acme", "expired", 10)] == ["a1"]
    assert await store.approval_list("acme", "pending", 10) == []


async def test_an_approval_is_redeemed_once(backing: Backing, store: Store) -> None:
    await store.approval_put(approval_record("a1", requested_at=now(backing)), RETAIN)
    await store.approval_decide("acme", "a1", approve())
    assert await store.approval_redeem("globex", "a1") is False, "another tenant's id does not exist"
    assert await store.approval_redeem("acme", "unknown") is False
    results = await asyncio.gather(*(store.approval_redeem("acme", "a1") for _ in range(8)))
    assert sorted(results) == [False] * 7 + [True]
    assert await store.approval_redeem("acme", "a1") is False
