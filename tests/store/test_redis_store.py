"""The Redis store beyond the shared contract: key layout, TTLs, and window arithmetic checked
by planting buckets relative to the server's clock (which a test cannot move)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import astuple

import orjson
import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot

from gateway.core.principal import Limits
from gateway.errors import StoreCorrupt
from gateway.settings import RedisStoreSettings
from gateway.store import keys
from gateway.store.base import WINDOW_S, AuditHead, QuotaScope
from gateway.store.redis_store import RedisStore
from testkit.procs import shared_redis_url
from tests.store.conftest import delete_prefix
from tests.store.helpers import admit_request, chained, key_record, key_scope, tenant_scope


@pytest.fixture
async def prefix() -> AsyncIterator[str]:
    prefix = f"agw-test-{uuid.uuid4().hex[:12]}"
    yield prefix
    await delete_prefix(prefix)


@pytest.fixture
async def store(prefix: str) -> AsyncIterator[RedisStore]:
    # These tests are about what is stored, not about failing fast (test_redis_unavailable's
    # business): the shipped 0.25 s read timeout failed a script reload here twice in ~8 full
    # runs on the loaded 2-core machine (CI included), so the fixture gives reads room.
    store = RedisStore(
        RedisStoreSettings(url=shared_redis_url(), key_prefix=prefix, socket_timeout_s=5, connect_timeout_s=5)
    )
    yield store
    await store.aclose()


@pytest.fixture
async def client() -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(shared_redis_url())
    yield client
    await client.aclose()


async def server_second(client: aioredis.Redis) -> int:
    seconds, _ = await client.time()
    return int(seconds)


async def test_every_key_of_one_admit_shares_a_hash_slot(store: RedisStore, prefix: str) -> None:
    tenant = "ac:me}{"
    names = [name for scope in ("key:k1", "tenant") for name in astuple(keys.scope_keys(prefix, tenant, scope))]
    assert len({key_slot(name.encode()) for name in names}) == 1
    audit = [keys.audit_head(prefix), keys.audit_stream(prefix), keys.audit_anchor(prefix)]
    assert len({key_slot(name.encode()) for name in audit}) == 1
    records = [keys.key_records(prefix), keys.key_digests(prefix), keys.tenant_key_ids(prefix, tenant)]
    assert len({key_slot(name.encode()) for name in records}) == 1


async def test_quota_keys_expire_after_their_window(store: RedisStore, prefix: str, client: aioredis.Redis) -> None:
    scope = key_scope(rpm=10, tpm=100, daily_tokens=1000, max_concurrency=2)
    assert (await store.admit(admit_request(scope, tokens=5, ttl=30))).admitted
    names = keys.scope_keys(prefix, "acme", "key:k1")
    assert 0 < await client.ttl(names.requests) <= keys.WINDOW_TTL_S
    assert 0 < await client.ttl(names.tokens) <= keys.WINDOW_TTL_S
    assert keys.DAILY_TTL_S - 5 < await client.ttl(names.daily) <= keys.DAILY_TTL_S
    assert 30 < await client.ttl(names.leases) <= 30 + keys.LEASE_TTL_MARGIN_S
    assert (await store.admit(admit_request(scope, ttl=1))).admitted
    assert await client.ttl(names.leases) > 30, "a short lease must not cut a long one's TTL"


async def test_a_renewal_extends_the_lease_set_ttl(store: RedisStore, prefix: str, client: aioredis.Redis) -> None:
    scope = key_scope(max_concurrency=2)
    held = await store.admit(admit_request(scope, ttl=10))
    assert held.reservation is not None
    await store.renew_lease("acme", (scope,), held.reservation.lease_id, 100)
    assert await client.ttl(keys.scope_keys(prefix, "acme", "key:k1").leases) > 100


async def test_rpm_retry_after_points_at_the_oldest_bucket(
    store: RedisStore, prefix: str, client: aioredis.Redis
) -> None:
    name = keys.scope_keys(prefix, "acme", "key:k1").requests
    now = await server_second(client)
    await client.hset(name, mapping={str(now - 50): 2, str(now - 20): 1})
    denied = await store.admit(admit_request(key_scope(rpm=3)))
    assert denied.retry_after_s == pytest.approx(10, abs=1.1)
    assert denied.usage["key:k1"].requests_reset_s == pytest.approx(WINDOW_S - 20, abs=1.1)
    assert not (await store.admit(admit_request(key_scope(rpm=2)))).admitted


async def test_buckets_that_left_the_window_are_dropped(store: RedisStore, prefix: str, client: aioredis.Redis) -> None:
    name = keys.scope_keys(prefix, "acme", "key:k1").tokens
    now = await server_second(client)
    await client.hset(name, mapping={str(now - WINDOW_S - 1): 1000, str(now - 5): 10})
    result = await store.admit(admit_request(key_scope(tpm=100), tokens=50))
    assert result.admitted
    assert result.usage["key:k1"].tokens_remaining == 40
    assert str(now - WINDOW_S - 1).encode() not in await client.hkeys(name)


async def test_scripts_are_reloaded_after_redis_forgets_them(store: RedisStore, client: aioredis.Redis) -> None:
    assert (await store.admit(admit_request(tenant_scope(rpm=5)))).admitted
    await client.script_flush()
    assert (await store.admit(admit_request(tenant_scope(rpm=5)))).admitted
    assert await store.audit_append(AuditHead(0, ""), chained(AuditHead(0, ""), 1))


async def test_records_are_stored_as_json_the_operator_can_read(
    store: RedisStore, prefix: str, client: aioredis.Redis
) -> None:
    record = key_record("k1", limits=Limits(rpm=3))
    await store.put_key(record)
    assert await client.hget(keys.key_digests(prefix), record.digest) == b"k1"
    records = chained(AuditHead(0, ""), 2)
    assert await store.audit_append(AuditHead(0, ""), records)
    entries = await client.xrange(keys.audit_stream(prefix))
    assert [entry_id for entry_id, _ in entries or []] == [b"1-0", b"2-0"]
    assert await client.hgetall(keys.audit_head(prefix)) == {b"seq": b"2", b"hash": records[1].hash.encode()}


async def test_an_unlimited_scope_writes_no_keys(store: RedisStore, prefix: str, client: aioredis.Redis) -> None:
    assert (await store.admit(admit_request(QuotaScope("tenant", Limits()), tokens=10))).admitted
    assert [k async for k in client.scan_iter(match=keys.all_keys_pattern(prefix))] == []


async def test_a_malformed_api_key_reads_back_as_store_corrupt_naming_it(
    store: RedisStore, prefix: str, client: aioredis.Redis
) -> None:
    await store.put_key(key_record("k1"))
    await store.put_key(key_record("k2"))
    # Limits(**raw) raised TypeError here, a 500 with a traceback on the auth path.
    await client.hset(keys.key_records(prefix), "k2", orjson.dumps({"secret": 7})[:-1])
    digest = key_record("k2").digest
    for read, key in [
        (store.get_key("k2"), "k2"),
        (store.find_key(digest), f"with digest {digest[:12]}"),
        (store.list_keys(None), "k2"),
        (store.list_keys("acme"), "k2"),
    ]:
        with pytest.raises(StoreCorrupt) as caught:
            await read
        assert caught.value.key == key
        assert "secret" not in caught.value.public_message
    await client.hset(keys.key_records(prefix), "k2", orjson.dumps({**key_record("k2").to_dict(), "limits": 3}))
    with pytest.raises(StoreCorrupt):
        await store.get_key("k2")
    assert await store.get_key("k1") == key_record("k1")
