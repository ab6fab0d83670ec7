"""Noticing a store that lost everything (issue 12: a Redis restarted without persistence came back
empty; 153 of 264 requests got 401, the audit chain restarted at seq 1, and nothing said so).

The store keeps an epoch, a random id written once (`Store.store_epoch`). Each replica remembers
the epoch it first saw; seeing another one later means the store was emptied or replaced in
between. The replica then stays not ready (readiness names the problem), logs an error for the
operator, and appends a `store_wiped` record to the audit chain, which `gateway audit verify`
reports as a discontinuity.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid

from gateway.audit.writer import AuditWriter
from gateway.errors import StoreUnavailable
from gateway.store.base import LifecycleStore

log = logging.getLogger(__name__)


class StoreEpoch:
    def __init__(self, store: LifecycleStore, audit: AuditWriter, interval_s: float = 2.0) -> None:
        self._store = store
        self._audit = audit
        self._interval_s = interval_s
        self._mine: str | None = None
        self.wiped: str | None = None  # the operator-facing explanation, once noticed

    async def check(self) -> None:
        """Read (or, on an empty store, set) the epoch; raises StoreUnavailable when the store
        cannot be reached."""
        seen = await self._store.store_epoch(uuid.uuid4().hex)
        if self._mine is None:
            self._mine = seen
        elif seen != self._mine and self.wiped is None:
            await self._noticed(seen)

    async def _noticed(self, seen: str) -> None:
        written = self._audit.peak_seq
        self.wiped = (
            f"store wiped: its epoch changed from {self._mine} to {seen}, so it was emptied or replaced "
            f"since this replica started; keys, quotas, sessions and audit records written before are "
            f"gone (this replica had written the audit chain up to seq {written}). Restore the store "
            f"from its persistence or a backup, or accept the loss, then restart the replicas."
        )
        log.error(self.wiped)
        body = {"kind": "store_wiped", "previous_epoch": self._mine, "epoch": seen, "previous_seq": written}
        with contextlib.suppress(StoreUnavailable):  # a full queue: the log line above still says it
            await self._audit.submit(body)

    async def run(self) -> None:
        """Check every `interval_s` (readiness also checks on each probe)."""
        while True:
            with contextlib.suppress(StoreUnavailable):
                await self.check()
            await asyncio.sleep(self._interval_s)
