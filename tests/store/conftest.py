"""Stores under test: one contract, two implementations, both against the real thing.

Each Redis test gets its own key prefix and deletes every key under it afterwards, so tests
can run beside each other (and beside a gateway) on the session's Redis (tests/conftest.py starts
it on a free port; `shared_redis_url()`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from gateway.settings import EmbeddedStoreSettings, RedisStoreSettings
from gateway.store import keys
from gateway.store.base import Store
from gateway.store.embedded import EmbeddedStore
from gateway.store.redis_store import RedisStore
from testkit.procs import shared_redis_url
from tests.cluster.redis_cluster import RedisCluster


class MovableClock:
    """Real time plus an offset a test can move forward (the embedded store's injected clock):
    tests that only wait in real time see real time."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


@dataclass
class Backing:
    """The data behind a store; `connect` opens one more client of it (another replica, or a
    CLI process beside the server), closed with the fixture. `clock` is the embedded stores'
    clock (None for Redis, whose clock is the server's and cannot be moved)."""

    kind: str
    connect: Callable[[], Store]
    opened: list[Store] = field(default_factory=list)
    clock: MovableClock | None = None

    def open(self) -> Store:
        store = self.connect()
        self.opened.append(store)
        return store


async def delete_prefix(prefix: str) -> None:
    client = aioredis.Redis.from_url(shared_redis_url())
    try:
        async for name in client.scan_iter(match=keys.all_keys_pattern(prefix), count=500):
            await client.delete(name)
    finally:
        await client.aclose()


@pytest.fixture(params=["embedded", "redis", "cluster"])
async def backing(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backing]:
    prefix = f"agw-test-{uuid.uuid4().hex[:12]}"
    if request.param == "embedded":
        embedded_settings = EmbeddedStoreSettings(path=tmp_path / "data")
        clock = MovableClock()
        backing = Backing("embedded", lambda: EmbeddedStore(embedded_settings, clock=clock), clock=clock)
    else:
        # The contract is about semantics: generous timeouts keep a loaded machine from failing
        # the 500-admit bursts. Failing fast is test_redis_unavailable's business.
        cluster: RedisCluster | None = request.getfixturevalue("redis_cluster") if request.param == "cluster" else None
        redis_settings = RedisStoreSettings(
            url=cluster.url if cluster else shared_redis_url(),
            cluster=cluster is not None,
            key_prefix=prefix,
            socket_timeout_s=2.0,
            connect_timeout_s=2.0,
        )
        backing = Backing(request.param, lambda: RedisStore(redis_settings))
    try:
        yield backing
    finally:
        for store in backing.opened:
            await store.aclose()
        if backing.kind == "redis":
            await delete_prefix(prefix)


@pytest.fixture
def store(backing: Backing) -> Store:
    return backing.open()


@pytest.fixture
def replicas(backing: Backing, store: Store) -> list[Store]:
    """Two gateway replicas sharing quotas. Redis: two clients with their own pools. Embedded:
    quotas live in one process, so both "replicas" are the same store."""
    if backing.kind == "embedded":
        return [store, store]
    return [store, backing.open()]
