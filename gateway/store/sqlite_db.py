"""Key records, the audit chain, sessions, approvals and model releases in one SQLite file: the
embedded store's durable half (the session, approval and release tables and queries are in
sqlite_sessions.py, sqlite_approvals.py and sqlite_releases.py).

Every method here blocks on disk; EmbeddedStore runs them in a worker thread. One connection
serves the process, guarded by a lock (sqlite3 connections are not safe to share unguarded).
Other processes (the CLI beside a running server) open the same file: WAL mode lets them read
while one writes, and the busy timeout makes a writer wait for another instead of failing.
Autocommit mode means every read sees what other processes have committed.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import orjson

from gateway.store.audit_batch import AuditRecord, canonical
from gateway.store.base import AuditHead, KeyRecord
from gateway.store.fields import stored
from gateway.store.sqlite_approvals import SCHEMA as APPROVALS_SCHEMA
from gateway.store.sqlite_approvals import add_redeemed_column
from gateway.store.sqlite_releases import SCHEMA as RELEASES_SCHEMA
from gateway.store.sqlite_sessions import SCHEMA as SESSIONS_SCHEMA
from gateway.store.sqlite_sessions import migrate as migrate_sessions
from gateway.store.sqlite_tx import transaction

T = TypeVar("T")

_BUSY_TIMEOUT_S = 5.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS api_keys (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    digest TEXT NOT NULL,
    created_at REAL NOT NULL,
    record BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS api_keys_digest ON api_keys (digest);
CREATE INDEX IF NOT EXISTS api_keys_tenant ON api_keys (tenant, created_at);
CREATE TABLE IF NOT EXISTS audit_records (
    seq INTEGER PRIMARY KEY,
    record BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS audit_marks (  -- 'head', 'anchor' and 'epoch'
    name TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    hash TEXT NOT NULL
);
"""


def _record(raw: bytes | str, key: str) -> KeyRecord:
    with stored("API key", key):
        return KeyRecord.from_json(raw)


class SqliteDb:
    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._connection: sqlite3.Connection | None = None
        self._closed = False

    def _connect(self) -> sqlite3.Connection:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(self._path, timeout=_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        try:
            _use_wal(connection)
            # In WAL mode NORMAL syncs at checkpoints, not at every commit: a crashed process
            # loses nothing (the WAL is in the OS), only a power cut can lose the last commits.
            connection.execute("PRAGMA synchronous=NORMAL")
            connection.executescript(_SCHEMA + SESSIONS_SCHEMA + APPROVALS_SCHEMA + RELEASES_SCHEMA)
            add_redeemed_column(connection)
            migrate_sessions(connection)
        except BaseException:
            connection.close()
            raise
        return connection

    def run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run `work` on the connection (opened on first use), one caller at a time."""
        with self._lock:
            if self._closed:
                raise sqlite3.ProgrammingError("the store is closed")
            if self._connection is None:
                self._connection = self._connect()
            return work(self._connection)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    # --- API keys -------------------------------------------------------------------------
    @staticmethod
    def put_key(db: sqlite3.Connection, record: KeyRecord) -> None:
        # One row per id: replacing it replaces its digest, so an old secret stops resolving.
        db.execute(
            "INSERT OR REPLACE INTO api_keys (id, tenant, digest, created_at, record) VALUES (?, ?, ?, ?, ?)",
            (record.id, record.tenant, record.digest, record.created_at, orjson.dumps(record.to_dict())),
        )

    @staticmethod
    def get_key(db: sqlite3.Connection, key_id: str) -> KeyRecord | None:
        row = db.execute("SELECT record FROM api_keys WHERE id = ?", (key_id,)).fetchone()
        return None if row is None else _record(row[0], key_id)

    @staticmethod
    def find_key(db: sqlite3.Connection, digest: str) -> KeyRecord | None:
        row = db.execute("SELECT record FROM api_keys WHERE digest = ?", (digest,)).fetchone()
        # Named by its digest's start, which the caller can compute from its own secret.
        return None if row is None else _record(row[0], f"with digest {digest[:12]}")

    @staticmethod
    def list_keys(db: sqlite3.Connection, tenant: str | None) -> list[KeyRecord]:
        if tenant is None:
            rows = db.execute("SELECT record, id FROM api_keys ORDER BY created_at, id").fetchall()
        else:
            query = "SELECT record, id FROM api_keys WHERE tenant = ? ORDER BY created_at, id"
            rows = db.execute(query, (tenant,)).fetchall()
        return [_record(record, key_id) for record, key_id in rows]

    # --- audit chain ----------------------------------------------------------------------
    @staticmethod
    def store_epoch(db: sqlite3.Connection, candidate: str) -> str:
        # The epoch is a mark beside the audit head: the hash column holds its id.
        with transaction(db, "BEGIN IMMEDIATE"):
            db.execute("INSERT OR IGNORE INTO audit_marks (name, seq, hash) VALUES ('epoch', 0, ?)", (candidate,))
            row = db.execute("SELECT hash FROM audit_marks WHERE name = 'epoch'").fetchone()
        return str(row[0])

    @staticmethod
    def audit_mark(db: sqlite3.Connection, name: str) -> AuditHead:
        row = db.execute("SELECT seq, hash FROM audit_marks WHERE name = ?", (name,)).fetchone()
        return AuditHead(0, "") if row is None else AuditHead(int(row[0]), str(row[1]))

    @staticmethod
    def audit_append(db: sqlite3.Connection, expected: AuditHead, records: list[AuditRecord]) -> bool:
        # IMMEDIATE takes the write lock before reading the head, so two processes appending
        # to one chain are serialized: the second sees the first's head and is refused.
        with transaction(db, "BEGIN IMMEDIATE"):
            if SqliteDb.audit_mark(db, "head") != expected:
                return False
            if not records:
                return True
            db.executemany(
                "INSERT INTO audit_records (seq, record) VALUES (?, ?)",
                [(r.seq, canonical(r.to_dict())) for r in records],
            )
            _set_mark(db, "head", AuditHead(records[-1].seq, records[-1].hash))
        return True

    @staticmethod
    def audit_range(db: sqlite3.Connection, first_seq: int, limit: int) -> list[AuditRecord]:
        rows = db.execute(
            "SELECT record FROM audit_records WHERE seq >= ? ORDER BY seq LIMIT ?", (first_seq, limit)
        ).fetchall()
        with stored("audit record", f"from seq {first_seq}"):
            return [AuditRecord.from_json(row[0]) for row in rows]

    @staticmethod
    def audit_trim(db: sqlite3.Connection, before_seq: int, anchor: AuditHead) -> None:
        with transaction(db, "BEGIN IMMEDIATE"):
            db.execute("DELETE FROM audit_records WHERE seq < ?", (before_seq,))
            _set_mark(db, "anchor", anchor)


def _use_wal(db: sqlite3.Connection) -> None:
    """Switch a new file to WAL (persistent: later opens find it set).

    The switch needs the file to itself and fails at once, without waiting on the busy
    timeout, when another process is opening the same new file: retry until one of us has
    switched it."""
    deadline = time.monotonic() + _BUSY_TIMEOUT_S
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL").fetchone()
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
        time.sleep(0.01)


def _set_mark(db: sqlite3.Connection, name: str, mark: AuditHead) -> None:
    db.execute(
        "INSERT INTO audit_marks (name, seq, hash) VALUES (?, ?, ?) "
        "ON CONFLICT (name) DO UPDATE SET seq = excluded.seq, hash = excluded.hash",
        (name, mark.seq, mark.hash),
    )
