"""The tamper-evident audit log: a hash chain shared by every replica, written off the hot path.

Each record carries `seq`, the previous record's hash (`prev`) and its own `hash`, the SHA-256
of its canonical JSON without `hash`. Editing a record breaks its hash; deleting, inserting or
reordering breaks the sequence or the links. Replicas share one chain: a batch is chained to the
head the writer last saw and appended with compare-and-set; if another replica got there first,
the batch is re-chained onto the new head and tried again.

Writes never drop a record. `AuditWriter.submit` waits for room when the queue is full
(backpressure on whoever produces records); `reserve` + `submit_reserved` let the request path
take its slot before doing work, so that recording the outcome at the end cannot block or fail,
even when the request was cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.errors import StoreUnavailable
from gateway.store.base import AuditHead, Store

log = logging.getLogger(__name__)

_PAGE = 1000


def canonical(record: dict[str, Any]) -> bytes:
    return orjson.dumps(record, option=orjson.OPT_SORT_KEYS)


def record_hash(record: dict[str, Any]) -> str:
    return hashlib.sha256(canonical({k: v for k, v in record.items() if k != "hash"})).hexdigest()


def chain(head: AuditHead, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Link record bodies onto `head`: number them and hash each onto its predecessor."""
    chained = []
    seq, prev = head.seq, head.hash
    for body in bodies:
        seq += 1
        record = {**body, "seq": seq, "prev": prev}
        record["hash"] = prev = record_hash(record)
        chained.append(record)
    return chained


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    checked: int
    first_bad_seq: int | None = None
    reason: str = ""


def verify_records(records: list[dict[str, Any]], start: AuditHead) -> Verdict:
    """Check that `records` continue the chain from `start`; name the first record that does not."""
    seq, prev = start.seq, start.hash
    for checked, record in enumerate(records):
        seq += 1
        problem = _problem(record, seq, prev)
        if problem:
            return Verdict(False, checked, first_bad_seq=seq, reason=problem)
        prev = record["hash"]
    return Verdict(True, len(records))


def _problem(record: dict[str, Any], seq: int, prev: str) -> str:
    if record.get("seq") != seq:
        return f"expected seq {seq}, found {record.get('seq')} (a record was deleted, inserted or moved)"
    if record.get("prev") != prev:
        return "does not link to the previous record (a record before it was changed, deleted or moved)"
    if record_hash(record) != record.get("hash"):
        return "its content does not match its hash (the record was edited)"
    return ""


async def iterate(store: Store, first_seq: int = 1) -> AsyncIterator[dict[str, Any]]:
    seq = first_seq
    while True:
        page = await store.audit_range(seq, _PAGE)
        for record in page:
            yield record
        if len(page) < _PAGE:
            return
        seq = int(page[-1]["seq"]) + 1


async def verify_store(store: Store) -> Verdict:
    anchor = await store.audit_anchor()
    records = [r async for r in iterate(store, anchor.seq + 1)]
    return verify_records(records, anchor)


class AuditWriter:
    def __init__(
        self,
        store: Store,
        *,
        queue_size: int,
        batch_size: int,
        flush_interval_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._room = asyncio.Semaphore(queue_size)
        self._pending: deque[dict[str, Any]] = deque()
        self._batch_size = batch_size
        self._flush_interval_s = flush_interval_s
        self._clock = clock
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._head: AuditHead | None = None

    async def reserve(self) -> None:
        """Take a queue slot; waits while the queue is full."""
        await self._room.acquire()

    def release_reserved(self) -> None:
        """Give back a slot taken with `reserve` that will not carry a record (it was aggregated)."""
        self._room.release()

    def submit_reserved(self, body: dict[str, Any]) -> None:
        """Queue a record for a slot taken with `reserve`; never blocks, never fails."""
        self._pending.append({"ts": self._clock(), **body})
        self._wakeup.set()

    async def submit(self, body: dict[str, Any]) -> None:
        await self.reserve()
        self.submit_reserved(body)

    async def write_now(self, body: dict[str, Any]) -> None:
        """Append one record synchronously (CLI commands, which have no background writer)."""
        await self.submit(body)
        await self.flush()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="audit-writer")

    async def stop(self) -> None:
        """Flush what is queued, then stop."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.flush()

    @property
    def backlog(self) -> int:
        return len(self._pending)

    async def flush(self) -> None:
        while self._pending:
            await self._write_batch()

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            try:
                await self.flush()
            except StoreUnavailable as error:
                # Keep everything queued; backpressure builds until the store is back.
                log.warning("audit store unavailable, %d records waiting: %s", len(self._pending), error)
                await asyncio.sleep(1.0)
                self._wakeup.set()
                continue
            await asyncio.sleep(self._flush_interval_s)  # lets a batch accumulate under load

    async def _write_batch(self) -> None:
        bodies = [self._pending[i] for i in range(min(self._batch_size, len(self._pending)))]
        while True:
            head = self._head if self._head is not None else await self._store.audit_head()
            records = chain(head, bodies)
            if await self._store.audit_append(head, records):
                self._head = AuditHead(records[-1]["seq"], records[-1]["hash"])
                break
            self._head = None  # another replica appended: re-read the head and re-chain
        for _ in bodies:
            self._pending.popleft()
            self._room.release()
