"""Sessions in the embedded store's SQLite file (see gateway/store/base.py for the contract).

One row per session holds its state, its expiry and its lease; its events are stored in blocks,
one row per write holding that write's events packed together (a stream's ~20 events cost two or
three rows, not twenty: row inserts were most of a stream's checkpoint cost).
State and events share `expires_at`; the lease has `lease_expires`. A session whose `expires_at`
has passed reads as absent (no state, no events) even before its rows are purged; writing to it
first clears what it held, so it starts over exactly like an expired Redis session.

A session that has events or a lease but was never saved has a row with state NULL (it loads as
None until saved). `expires_at` = 0 marks a row created by a claim alone: no state or events yet.

Every function here is one statement or one transaction: these calls are on the streaming hot
path's background flusher.
"""

from __future__ import annotations

import sqlite3
import struct
from collections.abc import Iterator
from dataclasses import dataclass, replace

from gateway.store.base import SessionCheckpoint
from gateway.store.fields import stored
from gateway.store.session_batch import newer_events
from gateway.store.session_record import SessionState
from gateway.store.sqlite_tx import transaction

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    tenant TEXT NOT NULL,
    id TEXT NOT NULL,
    state BLOB,                -- JSON; NULL until the first save
    expires_at REAL NOT NULL,  -- of state and events (unix seconds, the store's clock)
    lease_owner TEXT,
    lease_expires REAL,
    PRIMARY KEY (tenant, id)
);
CREATE INDEX IF NOT EXISTS sessions_expiry ON sessions (expires_at);
CREATE TABLE IF NOT EXISTS session_event_blocks (
    tenant TEXT NOT NULL,
    id TEXT NOT NULL,
    first_seq INTEGER NOT NULL,
    last_seq INTEGER NOT NULL,
    events BLOB NOT NULL,      -- per event: seq (8 bytes), payload length (4 bytes), payload
    PRIMARY KEY (tenant, id, first_seq)
);
"""

_EVENT_HEADER = struct.Struct(">QI")

PURGE_BATCH = 200  # expired sessions removed per purge, so that one purge stays short

# Refresh state/events expiry; the lease keeps its own, cut to the session's but never extended.
# An expired row starts over: its state is dropped (its events were deleted just before).
_TOUCH = """
INSERT INTO sessions (tenant, id, state, expires_at) VALUES (:tenant, :id, :state, :expires)
ON CONFLICT (tenant, id) DO UPDATE SET
    state = CASE WHEN :replace THEN excluded.state
                 WHEN sessions.expires_at <= :now THEN NULL
                 ELSE sessions.state END,
    expires_at = excluded.expires_at,
    lease_expires = MIN(sessions.lease_expires, excluded.expires_at)
"""

_DROP_EXPIRED_EVENTS = """
DELETE FROM session_event_blocks WHERE tenant = :tenant AND id = :id
AND EXISTS (SELECT 1 FROM sessions s WHERE s.tenant = :tenant AND s.id = :id AND s.expires_at <= :now)
"""

_CLAIM = """
INSERT INTO sessions (tenant, id, state, expires_at, lease_owner, lease_expires)
VALUES (:tenant, :id, NULL, 0, :owner, :lease_expires)
ON CONFLICT (tenant, id) DO UPDATE SET lease_owner = excluded.lease_owner, lease_expires = excluded.lease_expires
WHERE sessions.lease_owner IS NULL OR sessions.lease_expires <= :now OR sessions.lease_owner = excluded.lease_owner
"""

_INSERT_NEW = """
INSERT INTO sessions (tenant, id, state, expires_at, lease_owner, lease_expires) VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (tenant, id) DO NOTHING
"""

# Every block holding an event after the given seq holds at least one: `limit` blocks suffice.
_EVENT_BLOCKS = """
SELECT b.events FROM session_event_blocks b JOIN sessions s ON s.tenant = b.tenant AND s.id = b.id
WHERE b.tenant = ? AND b.id = ? AND b.last_seq > ? AND s.expires_at > ?
ORDER BY b.first_seq LIMIT ?
"""

_DELETE_EVENTS = "DELETE FROM session_event_blocks WHERE tenant = ? AND id = ?"

_PURGEABLE = """
SELECT tenant, id FROM sessions
WHERE expires_at <= :now AND (lease_expires IS NULL OR lease_expires <= :now) LIMIT :batch
"""


def _touch(db: sqlite3.Connection, tenant: str, session_id: str, now: float, ttl_s: float, state: bytes | None) -> None:
    where = {"tenant": tenant, "id": session_id, "now": now}
    db.execute(_DROP_EXPIRED_EVENTS, where)
    db.execute(_TOUCH, {**where, "state": state, "expires": now + ttl_s, "replace": state is not None})


@dataclass(frozen=True, slots=True)
class Save:
    """One `session_save` of a batch written in one transaction (see group_commit.py)."""

    tenant: str
    session_id: str
    state: SessionState
    ttl_s: float


def save_all(db: sqlite3.Connection, items: list[Save], now: float, *, purge: bool) -> None:
    """Each item's state saved, in order, in one transaction; `purge`: also remove some
    long-expired sessions in it."""
    with transaction(db, "BEGIN IMMEDIATE"):
        if purge:
            _purge_expired(db, now)
        for item in items:
            _touch(db, item.tenant, item.session_id, now, item.ttl_s, item.state.to_json())


def load(db: sqlite3.Connection, tenant: str, session_id: str, now: float) -> SessionState | None:
    query = "SELECT state FROM sessions WHERE tenant = ? AND id = ? AND expires_at > ?"
    row = db.execute(query, (tenant, session_id, now)).fetchone()
    if row is None or row[0] is None:
        return None
    with stored("session state", session_id):
        return SessionState.from_json(row[0])


def append(
    db: sqlite3.Connection,
    tenant: str,
    session_id: str,
    events: list[tuple[int, bytes]],
    now: float,
    ttl_s: float,
    *,
    purge: bool,
) -> None:
    """`purge`: as for `save`."""
    # IMMEDIATE takes the write lock before reading the last seq: two writers (another process
    # on the same file) cannot both decide to insert the same seq.
    with transaction(db, "BEGIN IMMEDIATE"):
        if purge:
            _purge_expired(db, now)
        _touch(db, tenant, session_id, now, ttl_s, None)
        _insert_newer(db, tenant, session_id, events)


def _insert_newer(db: sqlite3.Connection, tenant: str, session_id: str, events: list[tuple[int, bytes]]) -> None:
    query = "SELECT MAX(last_seq) FROM session_event_blocks WHERE tenant = ? AND id = ?"
    last = db.execute(query, (tenant, session_id)).fetchone()[0] or 0
    kept = newer_events(events, last)
    if kept:
        db.execute(
            "INSERT INTO session_event_blocks (tenant, id, first_seq, last_seq, events) VALUES (?, ?, ?, ?, ?)",
            (tenant, session_id, kept[0][0], kept[-1][0], _pack(kept)),
        )


def _pack(events: list[tuple[int, bytes]]) -> bytes:
    parts: list[bytes] = []
    for seq, payload in events:
        parts += (_EVENT_HEADER.pack(seq, len(payload)), payload)
    return b"".join(parts)


def _unpack(block: bytes) -> Iterator[tuple[int, bytes]]:
    offset, header = 0, _EVENT_HEADER.size
    while offset < len(block):
        if offset + header > len(block):
            raise ValueError(f"an event block is cut short at byte {offset} of {len(block)}")
        seq, size = _EVENT_HEADER.unpack_from(block, offset)
        offset += header + size
        if offset > len(block):
            raise ValueError(f"an event block is cut short: an event of {size} bytes ends past byte {len(block)}")
        yield seq, block[offset - size : offset]


def checkpoint(db: sqlite3.Connection, items: list[SessionCheckpoint], now: float, *, purge: bool) -> None:
    """Every item in one transaction: one commit (one WAL sync) for all live sessions."""
    with transaction(db, "BEGIN IMMEDIATE"):
        if purge:
            _purge_expired(db, now)
        for item in items:
            _apply(db, item, now)


def open_sessions(db: sqlite3.Connection, items: list[SessionCheckpoint], now: float, *, purge: bool) -> list[bool]:
    """For each item in turn, claim its lease, then write the rest of it only if claimed; all in
    one transaction (see group_commit.py). True for each item whose claim succeeded."""
    opened = []
    with transaction(db, "BEGIN IMMEDIATE"):
        if purge:
            _purge_expired(db, now)
        for first in items:
            assert first.renew_owner is not None, "opening a session claims it for an owner"
            if first.new and _insert_new(db, first, now):
                opened.append(True)
                continue
            claimed = claim(db, first.tenant, first.session_id, first.renew_owner, now, first.lease_ttl_s)
            if claimed:
                _apply(db, replace(first, renew_owner=None), now)
            opened.append(claimed)
    return opened


def _insert_new(db: sqlite3.Connection, first: SessionCheckpoint, now: float) -> bool:
    """A session whose id the gateway just made, opened with its state: one row, inserted. False
    if a row is there after all, or the checkpoint is more than a state (the caller then opens it
    the ordinary way)."""
    if first.state is None or first.events:
        return False
    expires = now + first.ttl_s
    lease_expires = min(now + first.lease_ttl_s, expires)  # never past the session (as `_TOUCH` cuts it)
    params = (first.tenant, first.session_id, first.state.to_json(), expires, first.renew_owner, lease_expires)
    return db.execute(_INSERT_NEW, params).rowcount > 0


def _apply(db: sqlite3.Connection, item: SessionCheckpoint, now: float) -> None:
    if item.replace_events:
        db.execute(_DELETE_EVENTS, (item.tenant, item.session_id))
    state = item.state.to_json() if item.state is not None else None
    if state is not None or item.events:
        _touch(db, item.tenant, item.session_id, now, item.ttl_s, state)
    if item.events:
        _insert_newer(db, item.tenant, item.session_id, item.events)
    if item.renew_owner is not None:
        claim(db, item.tenant, item.session_id, item.renew_owner, now, item.lease_ttl_s)
    if item.release_owner is not None:
        release(db, item.tenant, item.session_id, item.release_owner)


def events(
    db: sqlite3.Connection, tenant: str, session_id: str, after_seq: int, limit: int, now: float
) -> list[tuple[int, bytes]]:
    found: list[tuple[int, bytes]] = []
    with stored("session events", session_id):
        for (block,) in db.execute(_EVENT_BLOCKS, (tenant, session_id, after_seq, now, limit)):
            found += (event for event in _unpack(bytes(block)) if event[0] > after_seq)
            if len(found) >= limit:
                break
    return found[:limit]


def migrate(db: sqlite3.Connection) -> None:
    """A file made when every event was a row of its own: each becomes a block of one."""
    if db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'session_events'").fetchone() is None:
        return
    with transaction(db, "BEGIN IMMEDIATE"):
        rows = db.execute("SELECT tenant, id, seq, event FROM session_events").fetchall()
        db.executemany(
            "INSERT OR IGNORE INTO session_event_blocks VALUES (?, ?, ?, ?, ?)",
            [(tenant, session_id, seq, seq, _pack([(seq, bytes(event))])) for tenant, session_id, seq, event in rows],
        )
        db.execute("DROP TABLE session_events")


def claim(db: sqlite3.Connection, tenant: str, session_id: str, owner: str, now: float, ttl_s: float) -> bool:
    """One statement: SQLite runs it atomically, so two claimers cannot both win."""
    params = {"tenant": tenant, "id": session_id, "owner": owner, "lease_expires": now + ttl_s, "now": now}
    return db.execute(_CLAIM, params).rowcount > 0


def release(db: sqlite3.Connection, tenant: str, session_id: str, owner: str) -> None:
    db.execute(
        "UPDATE sessions SET lease_owner = NULL, lease_expires = NULL WHERE tenant = ? AND id = ? AND lease_owner = ?",
        (tenant, session_id, owner),
    )


def delete(db: sqlite3.Connection, tenant: str, session_id: str, now: float) -> bool:
    """True if state/events or a lease were live (what Redis would still have had)."""
    with transaction(db, "BEGIN IMMEDIATE"):
        row = db.execute(
            "SELECT expires_at, lease_owner, lease_expires FROM sessions WHERE tenant = ? AND id = ?",
            (tenant, session_id),
        ).fetchone()
        db.execute(_DELETE_EVENTS, (tenant, session_id))
        db.execute("DELETE FROM sessions WHERE tenant = ? AND id = ?", (tenant, session_id))
    if row is None:
        return False
    expires_at, lease_owner, lease_expires = row
    return bool(expires_at > now or (lease_owner is not None and lease_expires > now))


def _purge_expired(db: sqlite3.Connection, now: float) -> None:
    """Remove a batch of sessions whose state, events and lease have all expired (in the
    caller's transaction). Reads never purge: they stay reads."""
    expired = db.execute(_PURGEABLE, {"now": now, "batch": PURGE_BATCH}).fetchall()
    db.executemany(_DELETE_EVENTS, expired)
    db.executemany("DELETE FROM sessions WHERE tenant = ? AND id = ?", expired)
