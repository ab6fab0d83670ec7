"""Redis releases beyond the shared contract: key layout as an operator sees it."""

from __future__ import annotations

from dataclasses import astuple, replace

import orjson
import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot

from gateway.errors import StoreCorrupt
from gateway.store import keys
from gateway.store.redis_store import RedisStore
from gateway.store.release_record import Canary, HistoryEntry, Release
from tests.store.helpers import canary, entry, release
from tests.store.test_redis_store import client, prefix, store
from tests.store.test_release_record import OLDEST_RELEASE, STORED_CANARY, STORED_ENTRY

__all__ = ["client", "prefix", "store"]  # the fixtures, shared with test_redis_store


async def test_every_release_key_shares_one_slot_and_names_are_encoded(prefix: str) -> None:
    model = "ac:me}{"
    names = [*astuple(keys.release_keys(prefix)), keys.release_versions(prefix, model)]
    names.append(keys.release_history(prefix, model))
    assert len({key_slot(name.encode()) for name in names}) == 1
    assert keys.release_member("a:b", "c") == "a%3Ab:c"
    assert keys.release_member("a", "b:c") == "a:b%3Ac"


async def test_releases_are_stored_as_the_operator_expects(
    store: RedisStore, prefix: str, client: aioredis.Redis
) -> None:
    record = release("v 1é", model="m/1", created_at=1000.25)
    assert await store.release_put(record)
    names = keys.release_keys(prefix)
    assert await client.hget(names.records, keys.release_member("m/1", "v 1é")) == orjson.dumps(record.to_dict())
    assert await client.zrange(keys.release_versions(prefix, "m/1"), 0, -1, withscores=True) == [
        ("v 1é".encode(), 1000.25)
    ]
    assert await store.release_list("m/1") == [record]
    assert await store.release_activate("m/1", "v 1é", 0, entry(to="v 1é")) == (True, 1)
    assert await client.hget(names.active, "m/1") == "v 1é".encode()
    assert await client.hget(names.generations, "m/1") == b"1"
    history = await client.lrange(keys.release_history(prefix, "m/1"), 0, -1)
    assert history == [orjson.dumps(replace(entry(to="v 1é"), generation=1).to_dict())]


async def test_a_canary_is_stored_verbatim_under_the_releases_tag(
    store: RedisStore, prefix: str, client: aioredis.Redis
) -> None:
    value = canary(share=0.1 + 0.2)
    assert await store.release_set_canary("m/1", value, 0) == (True, 1)
    names = keys.release_keys(prefix)
    assert await client.hget(names.canaries, "m/1") == orjson.dumps(value.to_dict())
    assert await client.hget(names.generations, "m/1") == b"1"
    assert await client.hget(names.active, "m/1") is None
    assert await store.release_set_canary("m/1", None, 1) == (True, 2)
    assert await client.hexists(names.canaries, "m/1") == 0


async def test_releases_canaries_and_history_written_before_records_were_typed_read_back(
    store: RedisStore, prefix: str, client: aioredis.Redis
) -> None:
    names = keys.release_keys(prefix)
    await client.hset(names.records, keys.release_member("m1", "v2"), orjson.dumps(OLDEST_RELEASE))
    await client.hset(names.canaries, "m1", orjson.dumps(STORED_CANARY))
    await client.rpush(keys.release_history(prefix, "m1"), orjson.dumps(STORED_ENTRY))
    assert await store.release_get("m1", "v2") == Release.from_dict(OLDEST_RELEASE)
    assert await store.release_canary("m1") == Canary.from_dict(STORED_CANARY)
    assert await store.release_history("m1", 10) == [HistoryEntry.from_dict(STORED_ENTRY)]


async def test_a_malformed_release_or_canary_reads_back_as_store_corrupt_naming_it(
    store: RedisStore, prefix: str, client: aioredis.Redis
) -> None:
    names = keys.release_keys(prefix)
    assert await store.release_put(release("v1"))
    await client.hset(names.records, keys.release_member("m1", "v2"), b'{"model": "m1", "secret": 7')
    await client.zadd(keys.release_versions(prefix, "m1"), {"v2": 2000.0})
    await client.hset(names.canaries, "m1", orjson.dumps({"version": 42}))
    await client.rpush(keys.release_history(prefix, "m1"), b"[]")
    for read, key in [
        (store.release_get("m1", "v2"), "m1@v2"),
        (store.release_list("m1"), "m1"),
        (store.release_canary("m1"), "m1"),
        (store.release_history("m1", 10), "m1"),
    ]:
        with pytest.raises(StoreCorrupt) as caught:
            await read
        assert caught.value.key == key
        assert "secret" not in caught.value.public_message
