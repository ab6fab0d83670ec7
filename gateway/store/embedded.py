"""The default store for one replica with nothing else to run.

Key records, the audit chain, session checkpoints, approvals and model releases live in
`<path>/gateway.db` (SQLite, shared safely with CLI processes using the same file); quota counters live in this
process's memory, which is exact for one replica and is lost on restart (windows are at most a
day long).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from gateway.errors import StoreUnavailable
from gateway.settings import EmbeddedStoreSettings
from gateway.store import approval_record, release_record
from gateway.store import sqlite_approvals as approvals
from gateway.store import sqlite_releases as releases
from gateway.store import sqlite_sessions as sessions
from gateway.store.approval_record import Approval, Decision, PendingCaps
from gateway.store.audit_batch import AuditRecord, check_batch
from gateway.store.base import (
    AdmitRequest,
    AdmitResult,
    AuditHead,
    KeyRecord,
    QuotaScope,
    Reservation,
    SessionCheckpoint,
)
from gateway.store.group_commit import GroupCommit
from gateway.store.memory_quota import MemoryQuotas
from gateway.store.release_record import Canary, HistoryEntry, Release
from gateway.store.session_batch import check_events, check_open, check_ttl
from gateway.store.session_record import SessionState
from gateway.store.sqlite_db import SqliteDb

T = TypeVar("T")

DB_FILE = "gateway.db"
# Sessions nobody reads again are removed by a later write, at most this often.
SESSION_PURGE_INTERVAL_S = 60.0


class EmbeddedStore:
    def __init__(self, settings: EmbeddedStoreSettings, *, clock: Callable[[], float] = time.time) -> None:
        """`clock` (unix seconds) drives the quota windows and session expiry; tests move it."""
        self.path = settings.path / DB_FILE
        self._db = SqliteDb(self.path)
        self._clock = clock
        self._quotas = MemoryQuotas(clock)
        self._next_purge = 0.0
        # Its own thread, so the event loop never waits on the disk or on another process's lock,
        # and a slow disk cannot use up the loop's default executor.
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedded-store")
        self._closed = False
        # Every new stream opens its session before its first upstream byte: concurrent opens
        # share one transaction.
        self._opens: GroupCommit[SessionCheckpoint, bool] = GroupCommit(self._open_sessions)
        # Every kept answer not streamed (a Responses response) is saved before it is answered:
        # concurrent saves share one transaction too.
        self._saves: GroupCommit[sessions.Save, None] = GroupCommit(self._save_sessions)

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        if self._closed:
            raise StoreUnavailable(f"the store {self.path} is closed")
        try:
            return await asyncio.get_running_loop().run_in_executor(self._thread, self._db.run, work)
        except (sqlite3.Error, OSError) as error:
            raise StoreUnavailable(f"the store file {self.path} cannot be used: {error}") from error

    # --- API keys -------------------------------------------------------------------------
    async def put_key(self, record: KeyRecord) -> None:
        await self._run(lambda db: SqliteDb.put_key(db, record))

    async def get_key(self, key_id: str) -> KeyRecord | None:
        return await self._run(lambda db: SqliteDb.get_key(db, key_id))

    async def find_key(self, digest: str) -> KeyRecord | None:
        return await self._run(lambda db: SqliteDb.find_key(db, digest))

    async def list_keys(self, tenant: str | None) -> list[KeyRecord]:
        return await self._run(lambda db: SqliteDb.list_keys(db, tenant))

    # --- quotas ---------------------------------------------------------------------------
    async def admit(self, request: AdmitRequest) -> AdmitResult:
        return self._quotas.admit(request)

    async def settle(
        self, tenant: str, scopes: tuple[QuotaScope, ...], reservation: Reservation, used_tokens: int
    ) -> None:
        self._quotas.settle(tenant, scopes, reservation, used_tokens)

    async def renew_lease(self, tenant: str, scopes: tuple[QuotaScope, ...], lease_id: str, ttl_s: float) -> None:
        self._quotas.renew_lease(tenant, scopes, lease_id, ttl_s)

    # --- audit chain ----------------------------------------------------------------------
    async def audit_head(self) -> AuditHead:
        return await self._run(lambda db: SqliteDb.audit_mark(db, "head"))

    async def audit_append(self, expected: AuditHead, records: list[AuditRecord]) -> bool:
        check_batch(expected, records)
        return await self._run(lambda db: SqliteDb.audit_append(db, expected, records))

    async def audit_range(self, first_seq: int, limit: int) -> list[AuditRecord]:
        if limit <= 0:
            return []
        return await self._run(lambda db: SqliteDb.audit_range(db, first_seq, limit))

    async def audit_trim(self, before_seq: int, anchor: AuditHead) -> None:
        await self._run(lambda db: SqliteDb.audit_trim(db, before_seq, anchor))

    async def audit_anchor(self) -> AuditHead:
        return await self._run(lambda db: SqliteDb.audit_mark(db, "anchor"))

    # --- sessions -------------------------------------------------------------------------
    def _purge_due(self, now: float) -> bool:
        if now < self._next_purge:
            return False
        self._next_purge = now + SESSION_PURGE_INTERVAL_S
        return True

    async def session_save(self, tenant: str, session_id: str, state: SessionState, ttl_s: float) -> None:
        check_ttl(ttl_s)
        await self._saves.submit(sessions.Save(tenant, session_id, state, ttl_s))

    async def _save_sessions(self, items: list[sessions.Save]) -> list[None]:
        now = self._clock()
        purge = self._purge_due(now)
        await self._run(lambda db: sessions.save_all(db, items, now, purge=purge))
        return [None] * len(items)

    async def session_load(self, tenant: str, session_id: str) -> SessionState | None:
        now = self._clock()
        return await self._run(lambda db: sessions.load(db, tenant, session_id, now))

    async def session_append(self, tenant: str, session_id: str, events: list[tuple[int, bytes]], ttl_s: float) -> None:
        check_ttl(ttl_s)
        check_events(events)
        now = self._clock()
        purge = self._purge_due(now)
        await self._run(lambda db: sessions.append(db, tenant, session_id, events, now, ttl_s, purge=purge))

    async def session_events(self, tenant: str, session_id: str, after_seq: int, limit: int) -> list[tuple[int, bytes]]:
        if limit <= 0:
            return []
        now = self._clock()
        return await self._run(lambda db: sessions.events(db, tenant, session_id, after_seq, limit, now))

    async def session_claim(self, tenant: str, session_id: str, owner: str, ttl_s: float) -> bool:
        check_ttl(ttl_s)
        now = self._clock()
        return await self._run(lambda db: sessions.claim(db, tenant, session_id, owner, now, ttl_s))

    async def session_release(self, tenant: str, session_id: str, owner: str) -> None:
        await self._run(lambda db: sessions.release(db, tenant, session_id, owner))

    async def session_checkpoint(self, items: list[SessionCheckpoint]) -> None:
        for item in items:
            check_ttl(item.ttl_s)
            check_events(item.events)
        if not items:
            return
        now = self._clock()
        purge = self._purge_due(now)
        await self._run(lambda db: sessions.checkpoint(db, items, now, purge=purge))

    async def session_open(self, first: SessionCheckpoint) -> bool:
        check_open(first)
        return await self._opens.submit(first)

    async def _open_sessions(self, items: list[SessionCheckpoint]) -> list[bool]:
        now = self._clock()
        purge = self._purge_due(now)
        return await self._run(lambda db: sessions.open_sessions(db, items, now, purge=purge))

    async def session_delete(self, tenant: str, session_id: str) -> bool:
        now = self._clock()
        return await self._run(lambda db: sessions.delete(db, tenant, session_id, now))

    # --- approvals ------------------------------------------------------------------------
    async def approval_put(self, record: Approval, ttl_s: float) -> None:
        new = approval_record.check_put(record, ttl_s)
        now = self._clock()
        await self._run(lambda db: approvals.put(db, new, now))

    async def approval_put_within(self, record: Approval, ttl_s: float, caps: PendingCaps) -> str | None:
        new = approval_record.check_put(record, ttl_s)
        now = self._clock()
        return await self._run(lambda db: approvals.put(db, new, now, caps))

    async def approval_get(self, tenant: str, approval_id: str) -> Approval | None:
        now = self._clock()
        return await self._run(lambda db: approvals.get(db, tenant, approval_id, now))

    async def approval_decide(self, tenant: str, approval_id: str, decision: Decision) -> tuple[bool, Approval | None]:
        blob = approval_record.check_decision(decision)
        status, now = decision.status, self._clock()
        return await self._run(lambda db: approvals.decide(db, tenant, approval_id, blob, status, now))

    async def approval_list(self, tenant: str | None, status: str | None, limit: int) -> list[Approval]:
        approval_record.check_status(status)
        if limit <= 0:
            return []
        now = self._clock()
        return await self._run(lambda db: approvals.list_approvals(db, tenant, status, limit, now))

    async def approval_redeem(self, tenant: str, approval_id: str) -> bool:
        now = self._clock()
        return await self._run(lambda db: approvals.redeem(db, tenant, approval_id, now))

    # --- releases -------------------------------------------------------------------------
    async def release_put(self, record: Release) -> bool:
        new = release_record.check_put(record)
        return await self._run(lambda db: releases.put(db, new))

    async def release_get(self, model: str, version: str) -> Release | None:
        return await self._run(lambda db: releases.get(db, model, version))

    async def release_list(self, model: str) -> list[Release]:
        return await self._run(lambda db: releases.list_releases(db, model))

    async def release_active(self, model: str) -> tuple[str | None, int]:
        return await self._run(lambda db: releases.active(db, model))

    async def release_activate(
        self, model: str, version: str, expected_generation: int, entry: HistoryEntry
    ) -> tuple[bool, int]:
        blob = release_record.check_activation(model, version, expected_generation, entry)
        return await self._run(lambda db: releases.activate(db, model, version, expected_generation, blob))

    async def release_history(self, model: str, limit: int) -> list[HistoryEntry]:
        if limit <= 0:
            return []
        return await self._run(lambda db: releases.history(db, model, limit))

    async def release_generations(self) -> dict[str, int]:
        return await self._run(releases.generations)

    async def release_canary(self, model: str) -> Canary | None:
        return await self._run(lambda db: releases.canary(db, model))

    async def release_set_canary(self, model: str, canary: Canary | None, expected_generation: int) -> tuple[bool, int]:
        blob = release_record.check_canary(model, canary, expected_generation)
        return await self._run(lambda db: releases.set_canary(db, model, blob, expected_generation))

    # --- lifecycle ------------------------------------------------------------------------
    def failing(self) -> str | None:
        return None  # a local file: its probe answers for all of it

    async def store_epoch(self, candidate: str) -> str:
        return await self._run(lambda db: SqliteDb.store_epoch(db, candidate))

    async def ping(self) -> None:
        await self._run(lambda db: db.execute("SELECT 1").fetchone())

    async def aclose(self) -> None:
        if self._closed:
            return
        # Set before awaiting: calls made from now on fail instead of queueing behind the close.
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(self._thread, self._db.close)
        self._thread.shutdown(wait=False)
