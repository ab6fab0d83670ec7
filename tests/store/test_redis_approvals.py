"""Redis approvals beyond the shared contract: key layout, slots and expiry as an operator sees
them, and forgotten approvals removed by later puts."""

from __future__ import annotations

import time
from dataclasses import astuple

import orjson
import redis.asyncio as aioredis
from redis.crc import key_slot

from gateway.store import keys
from gateway.store.approval_record import Decision
from gateway.store.redis_store import RedisStore
from tests.store.helpers import approval_record
from tests.store.test_redis_store import client, prefix, store

__all__ = ["client", "prefix", "store"]  # the fixtures, shared with test_redis_store


async def test_every_approval_key_shares_one_slot_and_members_are_encoded(prefix: str) -> None:
    names = [*astuple(keys.approval_keys(prefix)), keys.approval_tenant_index(prefix, "ac:me}{")]
    assert len({key_slot(name.encode()) for name in names}) == 1
    assert keys.approval_member("a:b", "c") == "a%3Ab:c"
    assert keys.approval_member("a", "b:c") == "a:b%3Ac"
    assert keys.approval_tenant_index(prefix, "a:b") == keys.approval_tenant_index_base(prefix) + "a%3Ab"


async def test_approvals_are_stored_as_the_operator_expects(
    store: RedisStore, prefix: str, client: aioredis.Redis
) -> None:
    record = approval_record("a1")
    await store.approval_put(record, 100)
    names, member = keys.approval_keys(prefix), keys.approval_member("acme", "a1")
    assert await client.hget(names.records, member) == orjson.dumps(record.to_dict())  # byte for byte
    assert await client.zscore(names.deadlines, member) == record.expires_at
    assert await client.zscore(names.forget, member) == record.expires_at + 100
    assert await client.zscore(names.order, member) == record.requested_at
    assert await client.zscore(keys.approval_tenant_index(prefix, "acme"), member) == record.requested_at
    pending = keys.approval_pending(prefix, "acme")
    assert await client.zscore(pending, member) == record.expires_at
    assert await client.hget(names.pending_keys, member) == record.key_id.encode()
    decision = Decision("approved", decided_by="alice")
    assert (await store.approval_decide("acme", "a1", decision))[0]
    assert await client.hget(names.decisions, member) == orjson.dumps(decision.to_dict())
    # Decided: no longer pending (the sets the caps count are left empty, so Redis drops them).
    assert not await client.exists(pending, names.pending_keys)
    forget_ms = keys.approval_forget_ms(record.expires_at + 100)
    kept = [name for name in astuple(names) if name != names.pending_keys]
    for name in [*kept, keys.approval_tenant_index(prefix, "acme")]:
        assert await client.pexpiretime(name) == forget_ms, name


async def test_keys_live_until_their_last_approval_is_forgotten(
    store: RedisStore, prefix: str, client: aioredis.Redis
) -> None:
    start = time.time()
    long, short = approval_record("long", requested_at=start), approval_record("short", requested_at=start + 1)
    await store.approval_put(long, 1000)
    await store.approval_put(short, 10)  # a shorter retention never cuts a key's life
    assert await client.pexpiretime(keys.approval_keys(prefix).records) == keys.approval_forget_ms(
        long.expires_at + 1000
    )


async def test_a_put_removes_forgotten_approvals_everywhere(
    store: RedisStore, prefix: str, client: aioredis.Redis
) -> None:
    names = keys.approval_keys(prefix)
    stale = keys.approval_member("old:tenant", "a0")
    stale_index = keys.approval_tenant_index(prefix, "old:tenant")
    await client.hset(names.records, stale, b"{}")
    await client.hset(names.decisions, stale, b'{"status":"approved"}')
    for name, score in ((names.deadlines, 1.0), (names.forget, 2.0), (names.order, 0.5), (stale_index, 0.5)):
        await client.zadd(name, {stale: score})
    await store.approval_put(approval_record("a1"), 100)
    assert await client.hexists(names.records, stale) == 0
    assert await client.hexists(names.decisions, stale) == 0
    for name in (names.deadlines, names.forget, names.order):
        assert await client.zscore(name, stale) is None
    assert await client.exists(stale_index) == 0
    assert [r.id for r in await store.approval_list(None, None, 10)] == ["a1"]


async def test_approval_scripts_are_reloaded_after_redis_forgets_them(
    store: RedisStore, client: aioredis.Redis
) -> None:
    await store.approval_get("acme", "a1")
    await client.script_flush()
    await store.approval_put(approval_record("a1"), 100)
    assert (await store.approval_decide("acme", "a1", Decision("rejected")))[0]
    assert [r.status for r in await store.approval_list("acme", "rejected", 10)] == ["rejected"]
