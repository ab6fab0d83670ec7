"""Embedded sessions beyond the shared contract: expiry by the injected clock to the edge,
durability across a restart, and expired rows purged by later writes."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gateway.errors import StoreCorrupt, StoreUnavailable
from gateway.settings import EmbeddedStoreSettings
from gateway.store.embedded import SESSION_PURGE_INTERVAL_S, EmbeddedStore
from gateway.store.session_record import SessionState
from tests.store.test_embedded import Clock

STATE = SessionState("streaming")


@pytest.fixture
def clock() -> Clock:
    return Clock(1_700_000_000.0)


@pytest.fixture
def settings(tmp_path: Path) -> EmbeddedStoreSettings:
    return EmbeddedStoreSettings(path=tmp_path / "data")


@pytest.fixture
def store(settings: EmbeddedStoreSettings, clock: Clock) -> EmbeddedStore:
    return EmbeddedStore(settings, clock=clock)


def rows(store: EmbeddedStore) -> tuple[int, int]:
    with sqlite3.connect(store.path) as db:
        sessions = db.execute("SELECT COUNT(*) FROM sessions").fetchone()[0]
        events = db.execute("SELECT COUNT(*) FROM session_event_blocks").fetchone()[0]
    return int(sessions), int(events)


async def test_a_session_expires_exactly_at_its_ttl(store: EmbeddedStore, clock: Clock) -> None:
    await store.session_save("acme", "s1", STATE, 10)
    await store.session_append("acme", "s1", [(1, b"a")], 10)
    clock.now += 9.99
    assert await store.session_load("acme", "s1") == STATE
    assert await store.session_events("acme", "s1", 0, 10) == [(1, b"a")]
    clock.now += 0.01
    assert await store.session_load("acme", "s1") is None
    assert await store.session_events("acme", "s1", 0, 10) == []


async def test_a_lease_lapses_exactly_at_its_ttl(store: EmbeddedStore, clock: Clock) -> None:
    assert await store.session_claim("acme", "s1", "a", 5)
    clock.now += 4.99
    assert not await store.session_claim("acme", "s1", "b", 5)
    clock.now += 0.01
    assert await store.session_claim("acme", "s1", "b", 5)


async def test_sessions_survive_a_restart(settings: EmbeddedStoreSettings, store: EmbeddedStore, clock: Clock) -> None:
    await store.session_save("acme", "s1", STATE, 60)
    await store.session_append("acme", "s1", [(1, b"a"), (2, b"b")], 60)
    assert await store.session_claim("acme", "s1", "a", 60)
    await store.aclose()
    reopened = EmbeddedStore(settings, clock=clock)
    assert await reopened.session_load("acme", "s1") == STATE
    assert await reopened.session_events("acme", "s1", 1, 10) == [(2, b"b")]
    assert not await reopened.session_claim("acme", "s1", "b", 60)
    await reopened.aclose()


async def test_expired_sessions_are_purged_by_a_later_write(store: EmbeddedStore, clock: Clock) -> None:
    for n in range(5):
        await store.session_save("acme", f"old{n}", STATE, 10)
        await store.session_append("acme", f"old{n}", [(1, b"a"), (2, b"b")], 10)
    await store.session_append("acme", "leased", [(1, b"a")], 10)
    assert await store.session_claim("acme", "leased", "a", 1000)  # after: a write would cut it to 10 s
    assert rows(store) == (6, 6)  # each append's events are one block
    clock.now += SESSION_PURGE_INTERVAL_S + 1
    await store.session_append("acme", "new", [(1, b"a")], 10)
    # The session whose lease is alive keeps its row (the lease still counts) until that lapses.
    assert rows(store) == (2, 2)
    assert not await store.session_claim("acme", "leased", "b", 10)
    assert await store.session_events("acme", "leased", 0, 10) == []


async def test_a_purge_waits_for_its_interval(store: EmbeddedStore, clock: Clock) -> None:
    await store.session_save("acme", "s0", STATE, 1)  # the first write purges (nothing) and sets the interval
    clock.now += 2
    await store.session_save("acme", "s1", STATE, 1)
    assert rows(store) == (2, 0)
    clock.now += SESSION_PURGE_INTERVAL_S
    await store.session_save("acme", "s2", STATE, 100)
    assert rows(store) == (1, 0)


async def test_a_closed_store_raises_store_unavailable_for_sessions(store: EmbeddedStore) -> None:
    await store.aclose()
    with pytest.raises(StoreUnavailable):
        await store.session_save("acme", "s1", STATE, 10)
    with pytest.raises(StoreUnavailable):
        await store.session_events("acme", "s1", 0, 10)
    with pytest.raises(StoreUnavailable):
        await store.session_claim("acme", "s1", "a", 10)


async def test_events_are_read_across_blocks_after_any_seq_up_to_the_limit(store: EmbeddedStore) -> None:
    await store.session_append("acme", "s1", [(1, b"a"), (2, b"b"), (3, b"c")], 60)
    await store.session_append("acme", "s1", [(4, b"d")], 60)
    await store.session_append("acme", "s1", [(5, b""), (6, b"f" * 70_000)], 60)
    assert rows(store) == (1, 3)
    assert [seq for seq, _ in await store.session_events("acme", "s1", 0, 100)] == [1, 2, 3, 4, 5, 6]
    assert await store.session_events("acme", "s1", 2, 2) == [(3, b"c"), (4, b"d")]
    assert await store.session_events("acme", "s1", 4, 10) == [(5, b""), (6, b"f" * 70_000)]
    assert await store.session_events("acme", "s1", 6, 10) == []


async def test_a_file_from_when_events_were_rows_is_migrated(settings: EmbeddedStoreSettings, clock: Clock) -> None:
    settings.path.mkdir(parents=True)
    path = EmbeddedStore(settings, clock=clock).path
    with sqlite3.connect(path) as db:
        db.executescript(
            """
            CREATE TABLE sessions (tenant TEXT NOT NULL, id TEXT NOT NULL, state BLOB, expires_at REAL NOT NULL,
                lease_owner TEXT, lease_expires REAL, PRIMARY KEY (tenant, id));
            CREATE TABLE session_events (tenant TEXT NOT NULL, id TEXT NOT NULL, seq INTEGER NOT NULL,
                event BLOB NOT NULL, PRIMARY KEY (tenant, id, seq));
            """
        )
        db.execute("INSERT INTO sessions VALUES ('acme', 's1', NULL, ?, NULL, NULL)", (clock.now + 60,))
        db.executemany("INSERT INTO session_events VALUES ('acme', 's1', ?, ?)", [(1, b"a"), (2, b"b")])
    store = EmbeddedStore(settings, clock=clock)
    assert await store.session_events("acme", "s1", 0, 10) == [(1, b"a"), (2, b"b")]
    await store.session_append("acme", "s1", [(2, b"again"), (3, b"c")], 60)
    assert await store.session_events("acme", "s1", 1, 10) == [(2, b"b"), (3, b"c")]
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT name FROM sqlite_master WHERE name = 'session_events'").fetchone() is None
    await store.aclose()


async def test_a_damaged_event_block_is_store_corrupt_naming_the_session(store: EmbeddedStore) -> None:
    await store.session_append("acme", "s1", [(1, b"abc")], 60)
    with sqlite3.connect(store.path) as db:
        db.execute("UPDATE session_event_blocks SET events = substr(events, 1, length(events) - 1)")
    with pytest.raises(StoreCorrupt, match="s1"):
        await store.session_events("acme", "s1", 0, 10)
