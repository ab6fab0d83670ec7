"""The tamper-evident audit log: a hash chain shared by every replica, written off the hot path.

Each record carries `seq`, the previous record's hash (`prev`) and its own `hash`, the SHA-256
of its canonical JSON without `hash`. Editing a record breaks its hash; deleting, inserting or
reordering breaks the sequence or the links. Replicas share one chain: a batch is chained to the
head the writer last saw and appended with compare-and-set; if another replica got there first,
the batch is re-chained onto the new head and tried again.

Writes never drop a record. `AuditWriter.submit` waits for room when the queue is full
(backpressure on whoever produces records). The request path splits it in two: `admit` waits for
room before any work is done, and `record` queues the outcome when it is known, without blocking or
failing, even when the request was cancelled. Nothing is held in between: a request waiting for a
person's approval or for its body keeps no queue slot from another tenant's request. The queue so
holds at most `queue_size` records plus those of the requests in flight when it filled (each such
request holds far more memory than its record).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.errors import StoreCorrupt, StoreUnavailable
from gateway.store.audit_batch import canonical
from gateway.store.base import AuditHead, AuditRecord, AuditStore

log = logging.getLogger("gateway.audit")  # the name it had as gateway/audit.py: operators filter by it

_PAGE = 1000


MAC = "hmac-sha256"  # the `mac` field of a record whose hash is an HMAC under `audit.hmac_key`


def record_hash(record: dict[str, Any], key: bytes = b"") -> str:
    body = canonical({k: v for k, v in record.items() if k != "hash"})
    if record.get("mac") == MAC:
        return hmac.new(key, body, hashlib.sha256).hexdigest()
    return hashlib.sha256(body).hexdigest()


def chain(head: AuditHead, bodies: list[dict[str, Any]], key: bytes = b"") -> list[AuditRecord]:
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
        chained.append(AuditRecord.from_dict(record))
    return chained


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    checked: int
    first_bad_seq: int | None = None
    reason: str = ""


def verify_records(records: list[AuditRecord], start: AuditHead, key: bytes = b"") -> Verdict:
    """Check that `records` continue the chain from `start`; name the first record that does not."""
    seq, prev = start.seq, start.hash
    for checked, record in enumerate(records):
        seq += 1
        problem = _problem(record, seq, prev, key)
        if problem:
            return Verdict(False, checked, first_bad_seq=seq, reason=problem)
        prev = record.hash
    return Verdict(True, len(records))


def _problem(record: AuditRecord, seq: int, prev: str, key: bytes) -> str:
    if record.seq != seq:
        return f"expected seq {seq}, found {record.seq} (a record was deleted, inserted or moved)"
    if record.prev != prev:
        return "does not link to the previous record (a record before it was changed, deleted or moved)"
    keyed = record.mac == MAC
    if key and not keyed:
        return "the record is not keyed, but audit.hmac_key is set: every record must carry an HMAC"
    if keyed and not key:
        return "the record is keyed with an HMAC: verify with audit.hmac_key (or GATEWAY_AUDIT_KEY) set"
    if not hmac.compare_digest(record_hash(record.to_dict(), key), record.hash):
        return "its content does not match its hash (the record was edited)"
    return ""


def head_mark(head: AuditHead, key: bytes = b"") -> dict[str, Any]:
    """The chain's head as a mark to keep outside the store; signed when there is a key."""
    return {"seq": head.seq, "hash": head.hash, "sig": _sign(head, key) if key else ""}


def _sign(head: AuditHead, key: bytes) -> str:
    return hmac.new(key, f"{head.seq}:{head.hash}".encode(), hashlib.sha256).hexdigest()


def check_head(mark: dict[str, Any], records: list[AuditRecord], anchor: AuditHead, key: bytes = b"") -> Verdict:
    """Does the chain (records after `anchor`) still reach `mark` and hold it? Catches truncation."""
    try:
        head = AuditHead(int(mark["seq"]), str(mark["hash"]))
    except (KeyError, TypeError, ValueError):
        return Verdict(False, len(records), reason="the head mark is not a {seq, hash, sig} object")
    if key and not hmac.compare_digest(_sign(head, key), str(mark.get("sig", ""))):
        return Verdict(False, len(records), reason="the head mark's signature does not match audit.hmac_key")
    last = AuditHead(records[-1].seq, records[-1].hash) if records else anchor
    if head.seq > last.seq:
        reason = f"the chain ends at seq {last.seq} but its head mark says seq {head.seq}: records were truncated"
        return Verdict(False, len(records), first_bad_seq=last.seq + 1, reason=reason)
    held = anchor.hash if head.seq == anchor.seq else next((r.hash for r in records if r.seq == head.seq), None)
    if head.seq >= anchor.seq and held != head.hash:
        return Verdict(False, len(records), first_bad_seq=head.seq, reason="the record at the head mark was replaced")
    return Verdict(True, len(records))


async def iterate(store: AuditStore, first_seq: int = 1) -> AsyncIterator[AuditRecord]:
    seq = first_seq
    while True:
        page = await store.audit_range(seq, _PAGE)
        for record in page:
            yield record
        if len(page) < _PAGE:
            return
        seq = page[-1].seq + 1


async def verify_store(store: AuditStore, key: bytes = b"") -> Verdict:
    """The chain from the anchor, and that it still reaches the store's head mark (read first, so
    records appended meanwhile only make the chain longer)."""
    head = await store.audit_head()
    anchor = await store.audit_anchor()
    try:
        records = [r async for r in iterate(store, anchor.seq + 1)]
    except StoreCorrupt as error:  # a stored record whose chain fields were broken: tampering too
        return Verdict(False, 0, reason=f"a stored record is not an audit record: {error.message}")
    verdict = verify_records(records, anchor, key)
    if not verdict.ok:
        return verdict
    return check_head(head_mark(head, key), records, anchor, key)


@dataclass(slots=True)
class WriterStats:
    """What went wrong in the writer, for metrics and readiness; none of it may be silent."""

    unencodable: int = 0  # records replaced by an audit_error record
    store_errors: int = 0  # failed attempts to reach the store (each retried)
    errors: int = 0  # anything else that interrupted a write (retried)
    refused: int = 0  # requests refused because the queue stayed full
    lost: int = 0  # records never written (store still down at shutdown); each one logged
    rolled_back: int = 0  # records this writer had appended that the store no longer holds


# Retrying a store that is down: the first retry soon, then no faster than this.
_BACKOFF_S = (0.05, 2.0)
_LOG_EVERY_S = 10.0  # a long outage logs its state this often, not once per retry


class AuditWriter:
    """Writes queued records in batches from one task that never dies: a store outage is waited
    out (records stay queued, backpressure builds), a record that cannot be encoded is replaced
    by an `audit_error` record, any other failure is logged and retried. `stuck_reason` tells
    readiness when records are not getting through."""

    def __init__(
        self,
        store: AuditStore,
        *,
        queue_size: int,
        batch_size: int,
        flush_interval_s: float,
        clock: Callable[[], float] = time.time,
        hmac_key: bytes = b"",
        reserve_wait_s: float = 5.0,
        stuck_after_s: float = 10.0,
        shutdown_wait_s: float = 10.0,
    ) -> None:
        self._store = store
        self._hmac_key = hmac_key
        self._queue_size = queue_size
        # Set while the queue has room; cleared by `record` when it fills, set again as records are written.
        self._room = asyncio.Event()
        self._room.set()
        self._pending: deque[dict[str, Any]] = deque()
        self._batch_size = batch_size
        self._flush_interval_s = flush_interval_s
        self._clock = clock
        self._reserve_wait_s = reserve_wait_s
        self._stuck_after_s = stuck_after_s
        self._shutdown_wait_s = shutdown_wait_s
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # Cancelling the task is not enough: a store call may absorb the cancellation (a Redis
        # call cancelled mid-flush did), and the loop would wait for the next record forever.
        self._stopping = False
        self._head: AuditHead | None = None
        # A batch whose append failed without an answer: Redis may have run it all the same.
        self._unsure: list[AuditRecord] | None = None
        self._blocked_since: float | None = None  # monotonic time of the first failure in a row
        self.highest_seq = 0  # the highest seq this writer appended to the chain the store holds now
        self.peak_seq = 0  # the highest seq it ever appended (a wiped store's loss, at least)
        self.stats = WriterStats()

    async def admit(self) -> None:
        """Wait until the queue has room; takes nothing, so the request's `record` is queued when
        it is ready, however long the request takes. Waits at most `reserve_wait_s`, then refuses
        (StoreUnavailable, a 503) rather than hang the request."""
        if not self.full:
            return  # without the task and timer a timeout makes (~1% of a request's CPU, py-spy)
        try:
            async with asyncio.timeout(self._reserve_wait_s):
                while self.full:  # records queued meanwhile may have filled it again
                    await self._room.wait()
        except TimeoutError:
            self.stats.refused += 1
            raise StoreUnavailable(
                f"the audit log is full ({self._queue_size} records waiting for the store)"
            ) from None

    def record(self, body: dict[str, Any]) -> None:
        """Queue a record of work that was admitted; never blocks, never fails."""
        self._pending.append({"ts": self._clock(), **body})
        if self.full:
            self._room.clear()
        self._wakeup.set()

    async def submit(self, body: dict[str, Any]) -> None:
        await self.admit()
        self.record(body)

    @property
    def full(self) -> bool:
        return len(self._pending) >= self._queue_size

    def _taken(self) -> None:
        """Records left the queue (written, or given up on at shutdown)."""
        if not self.full:
            self._room.set()

    def start(self) -> None:
        self._stopping = False
        self._task = asyncio.create_task(self._run(), name="audit-writer")

    async def stop(self) -> None:
        """Flush what is queued, waiting up to `shutdown_wait_s` for the store; what still cannot
        be written is counted as lost and logged record by record (recoverable from the log)."""
        if self._task is not None:
            self._stopping = True
            self._wakeup.set()
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                if _current_task_cancelling():  # our caller's cancellation, not the task's: pass it on
                    raise
            self._task = None
        deadline = time.monotonic() + self._shutdown_wait_s
        delay = _BACKOFF_S[0]
        while self._pending:
            try:
                await self.flush()
            except Exception as error:  # noqa: BLE001 - counted as lost below if it never succeeds
                if time.monotonic() + delay > deadline:
                    self._give_up(error)
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, _BACKOFF_S[1])

    def _give_up(self, error: BaseException) -> None:
        lost = len(self._pending)
        self.stats.lost += lost
        log.error("%d audit records lost: the store stayed unavailable through shutdown (%s)", lost, error)
        while self._pending:
            log.warning("audit record not stored: %s", canonical(self._pending.popleft()).decode())
        self._taken()

    @property
    def backlog(self) -> int:
        return len(self._pending)

    def stuck_reason(self) -> str | None:
        """Why records are not getting through, for readiness; None while they are."""
        if self._task is not None and self._task.done():
            return "the audit writer stopped"
        if self.full:
            return f"the audit queue is full ({self._queue_size} records)"
        since = self._blocked_since
        if since is not None and time.monotonic() - since >= self._stuck_after_s:
            return f"audit records have not been written for {time.monotonic() - since:.0f} s"
        return None

    async def flush(self) -> None:
        """Write every queued record, those that arrive meanwhile too."""
        while self._pending:
            await self._write_batch(self._batch_size)

    async def _flush_queued(self) -> None:
        """Write the records queued now. Those that arrive meanwhile wait for the next flush: were
        they written as they came, a steady load would keep one flush going with a transaction per
        record or two (each store round trip lets one or two more in), and `flush_interval_s`,
        which lets a batch accumulate, would never come."""
        left = len(self._pending)
        while left > 0 and self._pending:
            left -= await self._write_batch(min(left, self._batch_size))

    async def _run(self) -> None:
        delay = _BACKOFF_S[0]
        last_log = -_LOG_EVERY_S
        while not self._stopping:
            await self._wakeup.wait()
            self._wakeup.clear()
            try:
                await self._flush_queued()
            except Exception as error:  # the writer must never die: counted in stats, logged, retried
                if isinstance(error, StoreUnavailable):
                    self.stats.store_errors += 1
                else:
                    self.stats.errors += 1
                if self._blocked_since is None:
                    self._blocked_since = time.monotonic()
                if time.monotonic() - last_log >= _LOG_EVERY_S:
                    last_log = time.monotonic()
                    log.warning(
                        "audit writer cannot write, %d records waiting (retrying): %s",
                        len(self._pending),
                        error,
                        exc_info=not isinstance(error, StoreUnavailable),
                    )
                await asyncio.sleep(delay)
                delay = min(delay * 2, _BACKOFF_S[1])
                self._wakeup.set()
                continue
            if self._blocked_since is not None:
                log.info("audit writer caught up after %.1f s", time.monotonic() - self._blocked_since)
            self._blocked_since, delay = None, _BACKOFF_S[0]
            await asyncio.sleep(self._flush_interval_s)  # lets a batch accumulate under load

    async def _write_batch(self, most: int) -> int:
        """Write up to `most` records from the front of the queue; how many were written."""
        bodies = [self._pending[i] for i in range(min(most, len(self._pending)))]
        written = await self._written_before() if self._unsure is not None else None
        while written is None:
            head = self._head if self._head is not None else self._noticed_rollback(await self._store.audit_head())
            records = self._chain(head, bodies)
            try:
                appended = await self._store.audit_append(head, records)
            except StoreUnavailable:
                self._unsure, self._head = records, None
                raise
            if appended:
                written = records
            else:
                self._head = None  # another replica appended: re-read the head and re-chain
        self._head = AuditHead(written[-1].seq, written[-1].hash)
        self.highest_seq = max(self.highest_seq, self._head.seq)
        self.peak_seq = max(self.peak_seq, self._head.seq)
        for _ in written:
            self._pending.popleft()
        self._taken()
        return len(written)

    def _noticed_rollback(self, head: AuditHead) -> AuditHead:
        if head.seq < self.highest_seq:
            # Acknowledged appends are gone: a failover to a replica that had not received them,
            # or a store restored from an older copy (or wiped: see store_epoch). Say so.
            self.stats.rolled_back += self.highest_seq - head.seq
            log.error(
                "the audit chain went back from seq %d to seq %d: the store lost records this replica had "
                "written (failover to a lagging replica, restore or wipe); the chain continues from seq %d",
                self.highest_seq,
                head.seq,
                head.seq,
            )
            self.highest_seq = head.seq
        return head

    async def _written_before(self) -> list[AuditRecord] | None:
        """The unanswered batch if the store holds it after all, else None (write it again)."""
        assert self._unsure is not None
        unsure = self._unsure
        stored = await self._store.audit_range(unsure[0].seq, len(unsure))
        self._unsure = None
        if [r.hash for r in stored] == [r.hash for r in unsure]:
            return unsure
        return None

    def _chain(self, head: AuditHead, bodies: list[dict[str, Any]]) -> list[AuditRecord]:
        try:
            return chain(head, bodies, self._hmac_key)
        except TypeError:  # orjson's JSONEncodeError: e.g. an integer beyond 64 bits
            for i, body in enumerate(bodies):
                try:
                    canonical(body)
                except TypeError as error:
                    bodies[i] = self._pending[i] = self._error_record(body, error)
            return chain(head, bodies, self._hmac_key)

    def _error_record(self, body: dict[str, Any], error: TypeError) -> dict[str, Any]:
        self.stats.unencodable += 1
        request_id = body.get("request_id")
        log.error("an audit record could not be encoded (request %r): %s", request_id, error)
        return {
            "ts": body.get("ts") if isinstance(body.get("ts"), float) else self._clock(),
            "kind": "audit_error",
            "request_id": _plain(request_id),
            "original_kind": _plain(body.get("kind")),
            "error": f"the record could not be encoded: {error}",
        }


def _current_task_cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _plain(value: Any) -> str | None:
    """`value` if it is a string that encodes (no lone surrogates), else None."""
    if not isinstance(value, str):
        return None
    try:
        orjson.dumps(value)
    except TypeError:
        return None
    return value
