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
import hmac
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


MAC = "hmac-sha256"  # the `mac` field of a record whose hash is an HMAC under `audit.hmac_key`


def canonical(record: dict[str, Any]) -> bytes:
    return orjson.dumps(record, option=orjson.OPT_SORT_KEYS)


def record_hash(record: dict[str, Any], key: bytes = b"") -> str:
    body = canonical({k: v for k, v in record.items() if k != "hash"})
    if record.get("mac") == MAC:
        return hmac.new(key, body, hashlib.sha256).hexdigest()
    return hashlib.sha256(body).hexdigest()


def chain(head: AuditHead, bodies: list[dict[str, Any]], key: bytes = b"") -> list[dict[str, Any]]:
    """Link record bodies onto `head`: number them and hash each onto its predecessor (an HMAC
    under `key` when one is given, so that nobody without the key can re-hash an edited chain)."""
    chained = []
    seq, prev = head.seq, head.hash
    for body in bodies:
        seq += 1
        record = {**body, "seq": seq, "prev": prev}
        if key:
            record["mac"] = MAC
        record["hash"] = prev = record_hash(record, key)
        chained.append(record)
    return chained


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    checked: int
    first_bad_seq: int | None = None
    reason: str = ""


def verify_records(records: list[dict[str, Any]], start: AuditHead, key: bytes = b"") -> Verdict:
    """Check that `records` continue the chain from `start`; name the first record that does not."""
    seq, prev = start.seq, start.hash
    for checked, record in enumerate(records):
        seq += 1
        problem = _problem(record, seq, prev, key)
        if problem:
            return Verdict(False, checked, first_bad_seq=seq, reason=problem)
        prev = record["hash"]
    return Verdict(True, len(records))


def _problem(record: dict[str, Any], seq: int, prev: str, key: bytes) -> str:
    if record.get("seq") != seq:
        return f"expected seq {seq}, found {record.get('seq')} (a record was deleted, inserted or moved)"
    if record.get("prev") != prev:
        return "does not link to the previous record (a record before it was changed, deleted or moved)"
    keyed = record.get("mac") == MAC
    if key and not keyed:
        return "the record is not keyed, but audit.hmac_key is set: every record must carry an HMAC"
    if keyed and not key:
        return "the record is keyed with an HMAC: verify with audit.hmac_key (or GATEWAY_AUDIT_KEY) set"
    if not hmac.compare_digest(record_hash(record, key), str(record.get("hash"))):
        return "its content does not match its hash (the record was edited)"
    return ""


def head_mark(head: AuditHead, key: bytes = b"") -> dict[str, Any]:
    """The chain's head as a mark to keep outside the store; signed when there is a key."""
    return {"seq": head.seq, "hash": head.hash, "sig": _sign(head, key) if key else ""}


def _sign(head: AuditHead, key: bytes) -> str:
    return hmac.new(key, f"{head.seq}:{head.hash}".encode(), hashlib.sha256).hexdigest()


def check_head(mark: dict[str, Any], records: list[dict[str, Any]], anchor: AuditHead, key: bytes = b"") -> Verdict:
    """Does the chain (records after `anchor`) still reach `mark` and hold it? Catches truncation."""
    try:
        head = AuditHead(int(mark["seq"]), str(mark["hash"]))
    except (KeyError, TypeError, ValueError):
        return Verdict(False, len(records), reason="the head mark is not a {seq, hash, sig} object")
    if key and not hmac.compare_digest(_sign(head, key), str(mark.get("sig", ""))):
        return Verdict(False, len(records), reason="the head mark's signature does not match audit.hmac_key")
    last = AuditHead(int(records[-1]["seq"]), str(records[-1]["hash"])) if records else anchor
    if head.seq > last.seq:
        reason = f"the chain ends at seq {last.seq} but its head mark says seq {head.seq}: records were truncated"
        return Verdict(False, len(records), first_bad_seq=last.seq + 1, reason=reason)
    held = anchor.hash if head.seq == anchor.seq else next((r["hash"] for r in records if r["seq"] == head.seq), None)
    if head.seq >= anchor.seq and held != head.hash:
        return Verdict(False, len(records), first_bad_seq=head.seq, reason="the record at the head mark was replaced")
    return Verdict(True, len(records))


async def iterate(store: Store, first_seq: int = 1) -> AsyncIterator[dict[str, Any]]:
    seq = first_seq
    while True:
        page = await store.audit_range(seq, _PAGE)
        for record in page:
            yield record
        if len(page) < _PAGE:
            return
        seq = int(page[-1]["seq"]) + 1


async def verify_store(store: Store, key: bytes = b"") -> Verdict:
    """The chain from the anchor, and that it still reaches the store's head mark (read first, so
    records appended meanwhile only make the chain longer)."""
    head = await store.audit_head()
    anchor = await store.audit_anchor()
    records = [r async for r in iterate(store, anchor.seq + 1)]
    verdict = verify_records(records, anchor, key)
    if not verdict.ok:
        return verdict
    return check_head(head_mark(head, key), records, anchor, key)


class AuditWriter:
    def __init__(
        self,
        store: Store,
        *,
        queue_size: int,
        batch_size: int,
        flush_interval_s: float,
        clock: Callable[[], float] = time.time,
        hmac_key: bytes = b"",
    ) -> None:
        self._store = store
        self._hmac_key = hmac_key
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
            records = chain(head, bodies, self._hmac_key)
            if await self._store.audit_append(head, records):
                self._head = AuditHead(records[-1]["seq"], records[-1]["hash"])
                break
            self._head = None  # another replica appended: re-read the head and re-chain
        for _ in bodies:
            self._pending.popleft()
            self._room.release()
