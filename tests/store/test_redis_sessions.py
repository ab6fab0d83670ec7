"""Redis sessions beyond the shared contract: key layout, slots and TTLs as an operator sees them."""

from __future__ import annotations

from dataclasses import astuple

import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot

from gateway.errors import StoreCorrupt
from gateway.store import keys
from gateway.store.redis_store import RedisStore
from gateway.store.session_record import SessionState
from tests.store.test_redis_store import client, prefix, store

__all__ = ["client", "prefix", "store"]  # the fixtures, shared with test_redis_store

STATE = SessionState("streaming")


async def test_a_sessions_keys_share_a_hash_slot_and_its_ids_are_encoded(prefix: str) -> None:
    names = keys.session_keys(prefix, "ac:me}", "s:1}{")
    assert len({key_slot(name.encode()) for name in astuple(names)}) == 1
    assert names.state == f"{prefix}:{{s:ac%3Ame%7D:s%3A1%7D%7B}}:state"
    assert keys.session_keys(prefix, "a:b", "c") != keys.session_keys(prefix, "a", "b:c")


async def test_sessions_are_stored_as_the_operator_expects(
    store: RedisStore, prefix: str, client: aioredis.Redis
) -> None:
    await store.session_save("acme", "s1", STATE, 100)
    await store.session_append("acme", "s1", [(1, b"a"), (2, b"b")], 100)
    assert await store.session_claim("acme", "s1", "replica-a", 5)
    names = keys.session_keys(prefix, "acme", "s1")
    assert await client.get(names.state) == STATE.to_json()
    assert await client.xrange(names.events) == [(b"1-0", {b"e": b"a"}), (b"2-0", {b"e": b"b"})]
    assert await client.get(names.lease) == b"replica-a"
    assert 99_000 < await client.pttl(names.state) <= 100_000
    assert 99_000 < await client.pttl(names.events) <= 100_000
    assert 4_000 < await client.pttl(names.lease) <= 5_000


async def test_a_session_write_cuts_a_longer_lease_but_never_extends_one(
    store: RedisStore, prefix: str, client: aioredis.Redis
) -> None:
    lease = keys.session_keys(prefix, "acme", "s1").lease
    assert await store.session_claim("acme", "s1", "replica-a", 5)
    await store.session_append("acme", "s1", [(1, b"a")], 100)
    assert await client.pttl(lease) <= 5_000
    await store.session_save("acme", "s1", STATE, 2)
    assert 1_000 < await client.pttl(lease) <= 2_000


async def test_session_scripts_are_reloaded_after_redis_forgets_them(store: RedisStore, client: aioredis.Redis) -> None:
    await store.session_save("acme", "s1", STATE, 100)
    await client.script_flush()
    await store.session_append("acme", "s1", [(1, b"a")], 100)
    assert await store.session_claim("acme", "s1", "replica-a", 5)
    await store.session_release("acme", "s1", "replica-a")
    assert await store.session_events("acme", "s1", 0, 10) == [(1, b"a")]


async def test_a_malformed_session_state_or_audit_record_reads_back_as_store_corrupt(
    store: RedisStore, prefix: str, client: aioredis.Redis
) -> None:
    await client.set(keys.session_keys(prefix, "acme", "s1").state, b'{"status": "streaming", "secret"')
    with pytest.raises(StoreCorrupt) as caught:
        await store.session_load("acme", "s1")
    assert (caught.value.what, caught.value.key) == ("session state", "s1")
    assert "secret" not in caught.value.public_message
    await client.xadd(keys.audit_stream(prefix), {"r": b"[1, 2]"}, id=keys.stream_id(1))
    with pytest.raises(StoreCorrupt) as caught:
        await store.audit_range(1, 10)
    assert caught.value.what == "audit record"
