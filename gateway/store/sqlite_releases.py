"""Model releases in the embedded store's SQLite file (see gateway/store/base.py for the contract).

One row per release (immutable: a second put of a version is ignored), one row per model with
an active pointer (its active version and generation), the activation history keyed by
(model, generation), capped at release_record.HISTORY_CAP entries per model, and one row per
model with a running canary (its JSON, as set).

A canary set before any activation bumps the generation too, so the pointer row then exists with
the version '' - never a release's version (those are non-empty) - which reads as "none active".
The version column stays NOT NULL so that files created before canaries need no migration.

Every function here is one statement or one transaction.
"""

from __future__ import annotations

import sqlite3

from gateway.store.fields import stored
from gateway.store.release_record import HISTORY_CAP, Canary, HistoryEntry, NewRelease, Release
from gateway.store.sqlite_tx import transaction

SCHEMA = """
CREATE TABLE IF NOT EXISTS releases (
    model TEXT NOT NULL,
    version TEXT NOT NULL,
    created_at REAL NOT NULL,
    record BLOB NOT NULL,        -- JSON, as put
    PRIMARY KEY (model, version)
);
CREATE INDEX IF NOT EXISTS releases_order ON releases (model, created_at, version);
CREATE TABLE IF NOT EXISTS release_active (
    model TEXT PRIMARY KEY,
    version TEXT NOT NULL,       -- '': none active (only a canary was ever set)
    generation INTEGER NOT NULL  -- +1 at each activation and each canary set or cleared
);
CREATE TABLE IF NOT EXISTS release_canary (
    model TEXT PRIMARY KEY,
    canary BLOB NOT NULL         -- JSON, as set
);
CREATE TABLE IF NOT EXISTS release_history (
    model TEXT NOT NULL,
    generation INTEGER NOT NULL,
    entry BLOB NOT NULL,         -- JSON, as given plus its generation
    PRIMARY KEY (model, generation)
);
"""

_GENERATION = "SELECT version, generation FROM release_active WHERE model = ?"

_ACTIVATE = """
INSERT INTO release_active (model, version, generation) VALUES (:model, :version, :generation)
ON CONFLICT (model) DO UPDATE SET version = excluded.version, generation = excluded.generation
"""

# Bumps the generation and keeps the active version ('' - none - if the model had no row).
_BUMP = """
INSERT INTO release_active (model, version, generation) VALUES (:model, '', :generation)
ON CONFLICT (model) DO UPDATE SET generation = excluded.generation
"""

_NO_VERSION = ""


def put(db: sqlite3.Connection, new: NewRelease) -> bool:
    cursor = db.execute(
        "INSERT OR IGNORE INTO releases (model, version, created_at, record) VALUES (?, ?, ?, ?)",
        (new.model, new.version, new.created_at, new.blob),
    )
    return cursor.rowcount == 1


def get(db: sqlite3.Connection, model: str, version: str) -> Release | None:
    row = db.execute("SELECT record FROM releases WHERE model = ? AND version = ?", (model, version)).fetchone()
    if row is None:
        return None
    with stored("release", f"{model}@{version}"):
        return Release.from_json(row[0])


def list_releases(db: sqlite3.Connection, model: str) -> list[Release]:
    rows = db.execute("SELECT version, record FROM releases WHERE model = ? ORDER BY created_at, version", (model,))
    return [_release(model, version, record) for version, record in rows.fetchall()]


def _release(model: str, version: str, record: bytes) -> Release:
    with stored("release", f"{model}@{version}"):
        return Release.from_json(record)


def active(db: sqlite3.Connection, model: str) -> tuple[str | None, int]:
    row = db.execute(_GENERATION, (model,)).fetchone()
    if row is None:
        return None, 0
    version = str(row[0])
    return (None if version == _NO_VERSION else version), int(row[1])


def activate(db: sqlite3.Connection, model: str, version: str, expected: int, entry: bytes) -> tuple[bool, int]:
    # IMMEDIATE takes the write lock before the generation is read: of two processes activating
    # with the same expected generation, the second sees the first's and is refused.
    with transaction(db, "BEGIN IMMEDIATE"):
        _, generation = active(db, model)
        if generation != expected:
            return False, generation
        exists = db.execute("SELECT 1 FROM releases WHERE model = ? AND version = ?", (model, version)).fetchone()
        if exists is None:
            return False, generation
        generation += 1
        db.execute(_ACTIVATE, {"model": model, "version": version, "generation": generation})
        db.execute(
            "INSERT INTO release_history (model, generation, entry) VALUES (?, ?, ?)", (model, generation, entry)
        )
        db.execute("DELETE FROM release_history WHERE model = ? AND generation <= ?", (model, generation - HISTORY_CAP))
        # Promoting or rolling back ends the model's canary.
        db.execute("DELETE FROM release_canary WHERE model = ?", (model,))
    return True, generation


def history(db: sqlite3.Connection, model: str, limit: int) -> list[HistoryEntry]:
    rows = db.execute(
        "SELECT entry FROM release_history WHERE model = ? ORDER BY generation DESC LIMIT ?", (model, limit)
    )
    with stored("activation history", model):
        return [HistoryEntry.from_json(row[0]) for row in rows.fetchall()]


def generations(db: sqlite3.Connection) -> dict[str, int]:
    return {str(model): int(gen) for model, gen in db.execute("SELECT model, generation FROM release_active")}


def canary(db: sqlite3.Connection, model: str) -> Canary | None:
    row = db.execute("SELECT canary FROM release_canary WHERE model = ?", (model,)).fetchone()
    if row is None:
        return None
    with stored("canary", model):
        return Canary.from_json(row[0])


def set_canary(db: sqlite3.Connection, model: str, blob: bytes | None, expected: int) -> tuple[bool, int]:
    # IMMEDIATE, as in activate: the compare-and-set on the generation is under the write lock.
    with transaction(db, "BEGIN IMMEDIATE"):
        _, generation = active(db, model)
        if generation != expected:
            return False, generation
        generation += 1
        db.execute(_BUMP, {"model": model, "generation": generation})
        if blob is None:
            db.execute("DELETE FROM release_canary WHERE model = ?", (model,))
        else:
            db.execute(
                "INSERT INTO release_canary (model, canary) VALUES (?, ?)"
                " ON CONFLICT (model) DO UPDATE SET canary = excluded.canary",
                (model, blob),
            )
    return True, generation
