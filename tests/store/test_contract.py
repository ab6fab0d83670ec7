"""The Store contract, run against both implementations (see conftest.backing)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time

import pytest

from gateway.store.base import (
    WINDOW_S,
    AuditHead,
    Store,
)
from tests.store.conftest import Backing
from tests.store.helpers import (
    admit_all,
    admit_request,
    chained,
    key_record,
    key_scope,
    seconds_to_utc_midnight,
    tenant_scope,
)

# --- API keys -----------------------------------------------------------------------------


async def test_a_stored_key_is_found_by_id_and_by_digest(store: Store) -> None:
    record = key_record("k1")
    await store.put_key(record)
    assert await store.get_key("k1") == record
    assert await store.find_key(record.digest) == record


async def test_unknown_ids_and_digests_are_not_found(store: Store) -> None:
    await store.put_key(key_record("k1"))
    assert await store.get_key("k2") is None
    assert await store.find_key("0" * 64) is None


async def test_keys_are_listed_per_tenant_or_all_in_creation_order(store: Store) -> None:
    await store.put_key(key_record("k3", tenant="acme", created_at=30.0))
    await store.put_key(key_record("k1", tenant="acme", created_at=10.0))
    await store.put_key(key_record("k2", tenant="globex", created_at=20.0))
    assert [r.id for r in await store.list_keys("acme")] == ["k1", "k3"]
    assert [r.id for r in await store.list_keys("globex")] == ["k2"]
    assert [r.id for r in await store.list_keys(None)] == ["k1", "k2", "k3"]
    assert await store.list_keys("initech") == []


async def test_replacing_a_key_with_a_new_digest_forgets_the_old_digest(store: Store) -> None:
    old = key_record("k1")
    await store.put_key(old)
    rotated = dataclasses.replace(old, digest="f" * 64, prefix="agw_rotated1")
    await store.put_key(rotated)
    assert await store.find_key(old.digest) is None
    assert await store.find_key(rotated.digest) == rotated
    assert await store.get_key("k1") == rotated
    assert await store.list_keys("acme") == [rotated]


async def test_replacing_a_key_keeps_its_digest_when_unchanged(store: Store) -> None:
    record = key_record("k1")
    await store.put_key(record)
    revoked = dataclasses.replace(record, revoked_at=1500.0)
    await store.put_key(revoked)
    assert await store.find_key(record.digest) == revoked


async def test_a_key_moved_to_another_tenant_is_listed_only_there(store: Store) -> None:
    await store.put_key(key_record("k1", tenant="acme"))
    await store.put_key(key_record("k1", tenant="globex"))
    assert await store.list_keys("acme") == []
    assert [r.id for r in await store.list_keys("globex")] == ["k1"]


async def test_a_key_written_by_one_client_is_read_by_another(backing: Backing, store: Store) -> None:
    await store.get_key("warm-up")  # the reader's connection is open before the write
    writer = backing.open()
    record = key_record("k1")
    await writer.put_key(record)
    assert await store.find_key(record.digest) == record


# --- quotas -------------------------------------------------------------------------------


async def test_rpm_admits_exactly_the_limit(store: Store) -> None:
    results = await admit_all(store, [admit_request(key_scope(rpm=5)) for _ in range(8)])
    assert [r.admitted for r in results] == [True] * 5 + [False] * 3
    denied = results[-1]
    assert (denied.denied_scope, denied.denied_limit) == ("key:k1", "rpm")
    assert 1 <= denied.retry_after_s <= WINDOW_S
    assert denied.reservation is None
    assert [r.usage["key:k1"].requests_remaining for r in results] == [4, 3, 2, 1, 0, 0, 0, 0]
    assert 0 < denied.usage["key:k1"].requests_reset_s <= WINDOW_S


async def test_tpm_counts_the_tokens_of_each_request(store: Store) -> None:
    scope = key_scope(tpm=100)
    results = await admit_all(store, [admit_request(scope, tokens=n) for n in (40, 40, 30, 20)])
    assert [r.admitted for r in results] == [True, True, False, True]
    assert results[2].denied_limit == "tpm"
    assert 1 <= results[2].retry_after_s <= WINDOW_S
    assert [r.usage["key:k1"].tokens_remaining for r in results] == [60, 20, 20, 0]
    assert results[0].usage["key:k1"].requests_remaining is None


async def test_a_request_larger_than_the_tpm_limit_is_told_to_wait_a_full_window(store: Store) -> None:
    result = await store.admit(admit_request(key_scope(tpm=100), tokens=101))
    assert (result.admitted, result.denied_limit) == (False, "tpm")
    assert result.retry_after_s == WINDOW_S


async def test_daily_budget_is_spent_until_utc_midnight(store: Store) -> None:
    scope = key_scope(daily_tokens=100)
    results = await admit_all(store, [admit_request(scope, tokens=n) for n in (60, 60, 40)])
    assert [r.admitted for r in results] == [True, False, True]
    denied = results[1]
    assert denied.denied_limit == "daily_tokens"
    assert denied.retry_after_s == pytest.approx(seconds_to_utc_midnight(), abs=5)
    reservation = results[0].reservation
    assert reservation is not None
    assert reservation.day == int(time.time() // 86_400)


async def test_concurrency_is_capped_until_a_lease_is_settled(store: Store) -> None:
    scope = key_scope(max_concurrency=2)
    first, second, third = await admit_all(store, [admit_request(scope) for _ in range(3)])
    assert (first.admitted, second.admitted, third.admitted) == (True, True, False)
    assert (third.denied_limit, third.retry_after_s) == ("max_concurrency", 1.0)
    assert first.reservation is not None
    await store.settle("acme", (scope,), first.reservation, used_tokens=0)
    assert (await store.admit(admit_request(scope))).admitted
    assert not (await store.admit(admit_request(scope))).admitted


async def test_an_expired_lease_frees_its_slot(store: Store) -> None:
    scope = key_scope(max_concurrency=1)
    # A TTL of a second, not less: the second admit must land before the first lease lapses even
    # when this shared machine stalls the test for a few hundred milliseconds.
    assert (await store.admit(admit_request(scope, ttl=1.0))).admitted
    assert not (await store.admit(admit_request(scope, ttl=1.0))).admitted
    deadline = time.monotonic() + 5.0
    while not (await store.admit(admit_request(scope, ttl=30))).admitted:
        assert time.monotonic() < deadline, "the expired lease was never freed"
        await asyncio.sleep(0.05)


async def test_a_renewed_lease_outlives_its_first_ttl(store: Store) -> None:
    scope = key_scope(max_concurrency=1)
    held = await store.admit(admit_request(scope, ttl=1.0))
    assert held.reservation is not None
    await store.renew_lease("acme", (scope,), held.reservation.lease_id, 5.0)
    await asyncio.sleep(1.5)
    assert not (await store.admit(admit_request(scope))).admitted
    await store.settle("acme", (scope,), held.reservation, used_tokens=0)
    assert (await store.admit(admit_request(scope))).admitted


async def test_an_expired_lease_is_not_revived_by_renewal(store: Store) -> None:
    scope = key_scope(max_concurrency=1)
    held = await store.admit(admit_request(scope, ttl=0.1))
    assert held.reservation is not None
    await asyncio.sleep(0.3)
    await store.renew_lease("acme", (scope,), held.reservation.lease_id, 30.0)
    assert (await store.admit(admit_request(scope))).admitted


async def test_a_request_denied_by_its_tenant_takes_nothing_from_its_key(store: Store) -> None:
    key = key_scope(rpm=10, tpm=1000, daily_tokens=1000, max_concurrency=5)
    tenant = tenant_scope(rpm=1)
    first = await store.admit(admit_request(key, tenant, tokens=100))
    denied = await store.admit(admit_request(key, tenant, tokens=100))
    assert first.admitted
    assert (denied.admitted, denied.denied_scope, denied.denied_limit) == (False, "tenant", "rpm")
    assert denied.usage["key:k1"].requests_remaining == 9
    assert denied.usage["key:k1"].tokens_remaining == 900
    # The key alone still has room for exactly what the first request left.
    results = await admit_all(store, [admit_request(key, tokens=100) for _ in range(5)])
    assert [r.admitted for r in results] == [True, True, True, True, False]
    assert results[-1].denied_limit == "max_concurrency"


async def test_the_longest_wait_is_reported_when_several_limits_deny(store: Store) -> None:
    scope = key_scope(daily_tokens=10, max_concurrency=1)
    assert (await store.admit(admit_request(scope, tokens=10))).admitted
    denied = await store.admit(admit_request(scope, tokens=10))
    assert denied.denied_limit == "daily_tokens"
    assert denied.retry_after_s > 1.0


async def test_settling_replaces_the_reserved_tokens_with_the_used_ones(store: Store) -> None:
    scope = key_scope(tpm=200, daily_tokens=150)
    held = await store.admit(admit_request(scope, tokens=80))
    assert held.reservation is not None
    await store.settle("acme", (scope,), held.reservation, used_tokens=30)  # less than reserved
    after = await store.admit(admit_request(scope, tokens=70))
    assert after.usage["key:k1"].tokens_remaining == 100
    assert after.reservation is not None
    await store.settle("acme", (scope,), after.reservation, used_tokens=90)  # more than reserved
    assert (await store.admit(admit_request(scope))).usage["key:k1"].tokens_remaining == 80
    over = await store.admit(admit_request(scope, tokens=31))
    assert (over.admitted, over.denied_limit) == (False, "daily_tokens")  # 30 + 90 + 31 > 150
    assert (await store.admit(admit_request(scope, tokens=30))).admitted


async def test_settling_never_takes_a_counter_below_zero(store: Store) -> None:
    scope = key_scope(tpm=100, daily_tokens=100)
    held = await store.admit(admit_request(scope, tokens=50))
    assert held.reservation is not None
    for _ in range(3):  # a duplicate settlement must not hand out extra budget
        await store.settle("acme", (scope,), held.reservation, used_tokens=0)
    result = await store.admit(admit_request(scope, tokens=100))
    assert result.admitted
    assert result.usage["key:k1"].tokens_remaining == 0
    assert not (await store.admit(admit_request(scope, tokens=1))).admitted


async def test_scopes_without_limits_report_no_remaining(store: Store) -> None:
    result = await store.admit(admit_request(key_scope(max_concurrency=3), tenant_scope(), tokens=10))
    assert result.admitted
    for usage in result.usage.values():
        assert (usage.requests_remaining, usage.tokens_remaining) == (None, None)


async def test_tenants_have_separate_counters(store: Store) -> None:
    scope = tenant_scope(rpm=1)
    assert (await store.admit(admit_request(scope, tenant="acme"))).admitted
    assert (await store.admit(admit_request(scope, tenant="globex"))).admitted
    assert (await store.admit(admit_request(scope, tenant="ac:me}{x"))).admitted
    assert not (await store.admit(admit_request(scope, tenant="acme"))).admitted


async def test_concurrent_admits_from_two_replicas_take_exactly_the_limit(replicas: list[Store]) -> None:
    scope = key_scope(rpm=50)
    requests = [admit_request(scope, tenant_scope(tpm=10**9), tokens=7) for _ in range(500)]
    results = await asyncio.gather(*(replicas[i % 2].admit(r) for i, r in enumerate(requests)))
    assert sum(r.admitted for r in results) == 50
    assert {r.denied_limit for r in results if not r.admitted} == {"rpm"}


async def test_concurrent_admits_take_exactly_the_concurrency_limit(replicas: list[Store]) -> None:
    scope = key_scope(max_concurrency=20)
    requests = [admit_request(scope) for _ in range(200)]
    results = await asyncio.gather(*(replicas[i % 2].admit(r) for i, r in enumerate(requests)))
    assert sum(r.admitted for r in results) == 20


# --- audit chain --------------------------------------------------------------------------


async def test_an_empty_chain_has_an_empty_head_and_anchor(store: Store) -> None:
    assert await store.audit_head() == AuditHead(0, "")
    assert await store.audit_anchor() == AuditHead(0, "")
    assert await store.audit_range(1, 10) == []


async def test_appending_at_the_head_extends_the_chain(store: Store) -> None:
    first = chained(AuditHead(0, ""), 3)
    assert await store.audit_append(AuditHead(0, ""), first)
    head = AuditHead(3, first[-1].hash)
    assert await store.audit_head() == head
    second = chained(head, 2)
    assert await store.audit_append(head, second)
    assert await store.audit_range(1, 100) == first + second
    assert await store.audit_head() == AuditHead(5, second[-1].hash)


async def test_appending_to_a_stale_head_writes_nothing(store: Store) -> None:
    first = chained(AuditHead(0, ""), 2)
    assert await store.audit_append(AuditHead(0, ""), first)
    head = await store.audit_head()
    assert not await store.audit_append(AuditHead(0, ""), chained(AuditHead(0, ""), 1, writer="late"))
    stale_hash = AuditHead(2, "not-the-hash")
    assert not await store.audit_append(stale_hash, chained(stale_hash, 1, writer="late"))
    assert await store.audit_head() == head
    assert await store.audit_range(0, 100) == first


async def test_records_out_of_sequence_are_refused(store: Store) -> None:
    records = chained(AuditHead(0, ""), 2)
    records[1] = dataclasses.replace(records[1], seq=5)
    with pytest.raises(ValueError, match="seq 2"):
        await store.audit_append(AuditHead(0, ""), records)
    assert await store.audit_head() == AuditHead(0, "")


async def test_ranges_start_at_a_seq_and_stop_at_the_limit(store: Store) -> None:
    records = chained(AuditHead(0, ""), 10)
    assert await store.audit_append(AuditHead(0, ""), records)
    assert await store.audit_range(4, 3) == records[3:6]
    assert await store.audit_range(9, 100) == records[8:]
    assert await store.audit_range(11, 100) == []
    assert await store.audit_range(1, 0) == []


async def test_trimming_drops_old_records_and_keeps_the_anchor(store: Store) -> None:
    records = chained(AuditHead(0, ""), 6)
    assert await store.audit_append(AuditHead(0, ""), records)
    anchor = AuditHead(3, records[2].hash)
    await store.audit_trim(4, anchor)
    assert await store.audit_anchor() == anchor
    assert await store.audit_range(0, 100) == records[3:]
    head = await store.audit_head()
    assert head == AuditHead(6, records[-1].hash)
    more = chained(head, 1)
    assert await store.audit_append(head, more)
    assert await store.audit_range(1, 100) == records[3:] + more


async def test_two_writers_racing_for_the_head_never_fork_the_chain(backing: Backing, store: Store) -> None:
    other = backing.open()

    async def write(writer: Store, name: str, batches: int) -> None:
        for _ in range(batches):
            while True:
                head = await writer.audit_head()
                if await writer.audit_append(head, chained(head, 2, writer=name)):
                    break

    await asyncio.gather(write(store, "a", 15), write(other, "b", 15))
    records = await store.audit_range(1, 1000)
    assert [r.seq for r in records] == list(range(1, 61))
    assert all(r.prev == p.hash for p, r in itertools.pairwise(records))
    assert sorted(r.body["writer"] for r in records) == ["a"] * 30 + ["b"] * 30


async def test_ping_succeeds_on_a_reachable_store(store: Store) -> None:
    await store.ping()


async def test_a_request_with_no_scopes_is_admitted_with_a_reservation(store: Store) -> None:
    result = await store.admit(admit_request(tokens=5))
    assert result.admitted
    assert result.usage == {}
    assert result.reservation is not None
    assert result.reservation.day == result.reservation.second // 86_400
    await store.settle("acme", (), result.reservation, used_tokens=1)


async def test_the_store_epoch_is_set_once_and_shared_by_every_replica(backing: Backing) -> None:
    """Issue 12 item 6: a replica compares the epoch with the one it started with to notice a
    store that lost everything (a Redis restarted without persistence)."""
    first, second = backing.open(), backing.open()
    assert await first.store_epoch("epoch-a") == "epoch-a"
    assert await first.store_epoch("epoch-b") == "epoch-a"
    assert await second.store_epoch("epoch-c") == "epoch-a"
