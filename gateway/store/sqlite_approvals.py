"""Approvals in the embedded store's SQLite file (see gateway/store/base.py for the contract).

One row per approval: the record exactly as put, the decision beside it once there is one, and
the columns the queries need. `status` is 'pending' until decided; a pending row whose
`expires_at` has passed reads as expired (nothing is written when it lapses). A row whose
`forget_at` (expires_at + the retention) has passed reads as absent; puts remove such rows.

Every function here is one statement or one transaction, all times the store's clock.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from gateway.store import approval_record as approvals
from gateway.store.sqlite_tx import transaction

SCHEMA = """
CREATE TABLE IF NOT EXISTS approvals (
    tenant TEXT NOT NULL,
    id TEXT NOT NULL,
    status TEXT NOT NULL,        -- 'pending', 'approved', 'rejected' or 'expired' (decided so)
    requested_at REAL NOT NULL,
    expires_at REAL NOT NULL,    -- a pending approval lapses then (unix seconds)
    forget_at REAL NOT NULL,     -- it does not exist from then on
    record BLOB NOT NULL,        -- JSON, as put
    decision BLOB,               -- JSON merged over the record; NULL until decided
    redeemed_at REAL,            -- when its answer was collected (approval_redeem); NULL until then
    PRIMARY KEY (tenant, id)
);
CREATE INDEX IF NOT EXISTS approvals_order ON approvals (requested_at);
CREATE INDEX IF NOT EXISTS approvals_tenant_order ON approvals (tenant, requested_at);
CREATE INDEX IF NOT EXISTS approvals_forget ON approvals (forget_at);
CREATE INDEX IF NOT EXISTS approvals_pending ON approvals (tenant, status, expires_at);
"""

PURGE_BATCH = 200  # forgotten approvals removed per put, so that one put stays short

_STATE = f"""CASE WHEN decision IS NOT NULL THEN '{approvals.DECIDED}'
    WHEN expires_at <= :now THEN '{approvals.EXPIRED}' ELSE '{approvals.PENDING}' END"""

_EFFECTIVE_STATUS = "CASE WHEN status = 'pending' AND expires_at <= :now THEN 'expired' ELSE status END"

_GET = f"SELECT record, decision, {_STATE} FROM approvals WHERE tenant = :tenant AND id = :id AND forget_at > :now"

_LIST = f"""
SELECT record, decision, {_STATE} FROM approvals
WHERE forget_at > :now {{tenant}} AND (:status IS NULL OR {_EFFECTIVE_STATUS} = :status)
ORDER BY requested_at DESC, tenant DESC, id DESC LIMIT :limit
"""
_LIST_ALL = _LIST.format(tenant="")
_LIST_TENANT = _LIST.format(tenant="AND tenant = :tenant")

_PURGE = """
DELETE FROM approvals WHERE rowid IN (SELECT rowid FROM approvals WHERE forget_at <= :now LIMIT :batch)
"""

_INSERT = """
INSERT OR IGNORE INTO approvals (tenant, id, status, requested_at, expires_at, forget_at, record)
SELECT :tenant, :id, 'pending', :requested_at, :expires_at, :forget_at, :record WHERE :forget_at > :now
"""

# The condition is the whole decision: SQLite runs it atomically, and the write lock taken by
# BEGIN IMMEDIATE keeps another process from deciding between it and the read that follows.
_DECIDE = """
UPDATE approvals SET status = :status, decision = :decision
WHERE tenant = :tenant AND id = :id AND status = 'pending' AND expires_at > :now
"""


def _read(row: tuple[Any, ...] | None, key: str) -> approvals.Approval | None:
    return None if row is None else approvals.read(row[0], row[1], row[2], key)


# Pending as read: undecided and not lapsed. The key is read from the record (it has no column of
# its own); only the tenant's pending rows are read, through `approvals_pending`.
_PENDING = """
SELECT count(*), coalesce(sum(json_extract(CAST(record AS TEXT), '$.key_id') = :key_id), 0) FROM approvals
WHERE tenant = :tenant AND status = 'pending' AND expires_at > :now AND forget_at > :now
"""

_LIVE = "SELECT 1 FROM approvals WHERE tenant = :tenant AND id = :id AND forget_at > :now"


def put(
    db: sqlite3.Connection, new: approvals.NewApproval, now: float, caps: approvals.PendingCaps | None = None
) -> str | None:
    """A live approval with the same tenant and id is left as it is (a retried put cannot reset
    a decided one); a forgotten one is replaced. With `caps`: the cap reached ("key" or
    "tenant"), and nothing stored, if the key or its tenant has that many pending already."""
    params = {
        "tenant": new.tenant,
        "id": new.id,
        "requested_at": new.requested_at,
        "expires_at": new.expires_at,
        "forget_at": new.forget_at,
        "record": new.blob,
        "now": now,
    }
    with transaction(db, "BEGIN IMMEDIATE"):
        db.execute(_PURGE, {"now": now, "batch": PURGE_BATCH})
        db.execute("DELETE FROM approvals WHERE tenant = :tenant AND id = :id AND forget_at <= :now", params)
        if caps is not None and db.execute(_LIVE, params).fetchone() is None:
            tenant_pending, key_pending = db.execute(_PENDING, {**params, "key_id": new.key_id}).fetchone()
            if key_pending >= caps.per_key:
                return "key"
            if tenant_pending >= caps.per_tenant:
                return "tenant"
        db.execute(_INSERT, params)
    return None


def get(db: sqlite3.Connection, tenant: str, approval_id: str, now: float) -> approvals.Approval | None:
    return _read(db.execute(_GET, {"tenant": tenant, "id": approval_id, "now": now}).fetchone(), approval_id)


def decide(
    db: sqlite3.Connection, tenant: str, approval_id: str, decision: bytes, status: str, now: float
) -> tuple[bool, approvals.Approval | None]:
    where = {"tenant": tenant, "id": approval_id, "now": now}
    with transaction(db, "BEGIN IMMEDIATE"):
        won = db.execute(_DECIDE, {**where, "status": status, "decision": decision}).rowcount == 1
        row = db.execute(_GET, where).fetchone()
    return won, _read(row, approval_id)


_REDEEM = """
UPDATE approvals SET redeemed_at = :now
WHERE tenant = :tenant AND id = :id AND forget_at > :now AND redeemed_at IS NULL
"""


def redeem(db: sqlite3.Connection, tenant: str, approval_id: str, now: float) -> bool:
    return db.execute(_REDEEM, {"tenant": tenant, "id": approval_id, "now": now}).rowcount == 1


def add_redeemed_column(db: sqlite3.Connection) -> None:
    """A file made before approvals could be redeemed lacks the column (CREATE TABLE IF NOT EXISTS
    leaves an existing table alone)."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(approvals)")}
    if "redeemed_at" not in columns:
        db.execute("ALTER TABLE approvals ADD COLUMN redeemed_at REAL")


def list_approvals(
    db: sqlite3.Connection, tenant: str | None, status: str | None, limit: int, now: float
) -> list[approvals.Approval]:
    query = _LIST_ALL if tenant is None else _LIST_TENANT
    rows = db.execute(query, {"tenant": tenant, "status": status, "limit": limit, "now": now}).fetchall()
    return [approvals.read(row[0], row[1], row[2], "in a list") for row in rows]
