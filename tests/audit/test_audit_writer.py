"""The audit writer never dies and never loses a record silently (issues 11 and 12).

Real stores only: the embedded SQLite store, and a private redis-server the test may freeze
(SIGSTOP) or kill, never the shared one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import redis

from gateway.audit.writer import AuditWriter, iterate, verify_store
from gateway.errors import StoreUnavailable
from gateway.settings import EmbeddedStoreSettings, RedisStoreSettings
from gateway.store.audit_batch import canonical
from gateway.store.base import AuditHead, AuditRecord, Store
from gateway.store.embedded import EmbeddedStore
from gateway.store.redis_store import RedisStore
from tests.store.test_redis_unavailable import free_port, redis_server


async def until(condition: Callable[[], bool], within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def private_redis_store(port: int) -> RedisStore:
    """A store on a private Redis that these tests stop and start: a stopped one refuses at once,
    so reads get room (a loaded machine stalling a read is not what these tests are about)."""
    return RedisStore(
        RedisStoreSettings(
            url=f"redis://127.0.0.1:{port}/0", key_prefix="agw-test", socket_timeout_s=3, connect_timeout_s=3
        )
    )


async def records(store: Store) -> list[dict[str, object]]:
    return [r.to_dict() async for r in iterate(store)]


@pytest.fixture
async def embedded(tmp_path: Path) -> AsyncIterator[Store]:
    store = EmbeddedStore(EmbeddedStoreSettings(path=tmp_path / "data"))
    yield store
    await store.aclose()


def writer_for(store: Store, **options: float) -> AuditWriter:
    return AuditWriter(store, queue_size=100, batch_size=10, flush_interval_s=0.0, **options)  # type: ignore[arg-type]


async def test_a_record_that_cannot_be_encoded_becomes_an_error_record_and_the_writer_lives_on(
    embedded: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 11: upstream usage >= 2**64 made orjson raise inside the writer task, which died
    silently; the queue then filled and every request hung."""
    writer = writer_for(embedded)
    writer.start()
    try:
        await writer.submit({"kind": "request", "request_id": "bad", "prompt_tokens": 2**64})
        await writer.submit({"kind": "request", "request_id": "good", "prompt_tokens": 3})
        await until(lambda: writer.backlog == 0)
        stored = await records(embedded)
        assert [r["request_id"] for r in stored] == ["bad", "good"]
        assert stored[0]["kind"] == "audit_error"
        assert "64-bit" in str(stored[0]["error"])
        assert stored[1]["prompt_tokens"] == 3
        assert writer.stats.unencodable == 1
        assert writer.stuck_reason() is None
        assert "could not be encoded" in caplog.text
        assert (await verify_store(embedded)).ok
    finally:
        await writer.stop()


async def test_records_queued_while_redis_is_down_are_written_when_it_is_back(tmp_path: Path) -> None:
    port = free_port()
    store = private_redis_store(port)
    writer = writer_for(store, stuck_after_s=0.3)
    writer.start()
    try:
        with redis_server(port, tmp_path):
            await writer.submit({"kind": "request", "request_id": "before"})
            await until(lambda: writer.backlog == 0)
        for i in range(5):
            await writer.submit({"kind": "request", "request_id": f"during-{i}"})
        await until(lambda: writer.stuck_reason() is not None)  # readiness sees the writer blocked
        with redis_server(port, tmp_path):  # a new, empty Redis on the same port
            await until(lambda: writer.backlog == 0)
            assert writer.stuck_reason() is None
            ids = [r["request_id"] for r in await records(store)]
    finally:
        await writer.stop()
        await store.aclose()
    # The new server holds only what was queued during the outage (the old one kept no data).
    assert ids == [f"during-{i}" for i in range(5)]
    assert writer.stats.lost == 0


async def test_an_append_that_timed_out_but_happened_is_not_written_twice(tmp_path: Path) -> None:
    """A frozen Redis runs the append after the client gave up on it: the retry must notice that
    its batch is already there instead of chaining it a second time."""
    port = free_port()
    store = RedisStore(
        RedisStoreSettings(url=f"redis://127.0.0.1:{port}/0", key_prefix="agw-test", socket_timeout_s=0.2)
    )
    writer = writer_for(store)
    with redis_server(port, tmp_path) as server:
        writer.start()
        try:
            await writer.submit({"kind": "request", "request_id": "first"})
            await until(lambda: writer.backlog == 0)
            server.send_signal(signal.SIGSTOP)
            try:
                await writer.submit({"kind": "request", "request_id": "second"})
                await until(lambda: writer.stats.store_errors > 0)
            finally:
                server.send_signal(signal.SIGCONT)
            await until(lambda: writer.backlog == 0)
            ids = [r["request_id"] for r in await records(store)]
            verdict = await verify_store(store)
        finally:
            await writer.stop()
            await store.aclose()
    assert ids == ["first", "second"]
    assert verdict.ok


async def test_records_that_cannot_be_written_by_shutdown_are_counted_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()  # nothing listens: the store is down for the whole test
    store = private_redis_store(port)
    writer = writer_for(store, shutdown_wait_s=0.3)
    writer.start()
    for i in range(3):
        await writer.submit({"kind": "request", "request_id": f"r{i}"})
    with caplog.at_level(logging.WARNING, logger="gateway.audit"):
        await asyncio.wait_for(writer.stop(), timeout=10)
    await store.aclose()
    assert writer.stats.lost == 3
    assert "3 audit records lost" in caplog.text
    assert '"request_id":"r2"' in caplog.text  # each lost record is in the log, recoverable


@pytest.mark.timing
async def test_a_full_queue_refuses_after_a_bounded_wait_instead_of_hanging(tmp_path: Path) -> None:
    port = free_port()
    store = private_redis_store(port)
    writer = AuditWriter(store, queue_size=2, batch_size=10, flush_interval_s=0.0, reserve_wait_s=0.2)
    writer.start()
    try:
        await writer.submit({"kind": "request"})
        await writer.submit({"kind": "request"})
        with pytest.raises(StoreUnavailable, match="audit"):
            await asyncio.wait_for(writer.admit(), timeout=10)
        assert writer.stats.refused == 1
        assert writer.stuck_reason() is not None
    finally:
        await writer.stop()
        await store.aclose()


async def test_admitted_work_holds_no_slot_and_its_record_is_queued_even_past_a_full_queue() -> None:
    """Work waiting for a person or a body must not keep room from others; its record, when it
    comes, is queued whatever the queue holds then (every admitted request has its record)."""
    store = private_redis_store(free_port())  # nothing listens: nothing is ever written
    writer = AuditWriter(
        store, queue_size=2, batch_size=10, flush_interval_s=0.0, reserve_wait_s=0.2, shutdown_wait_s=0.3
    )
    writer.start()
    try:
        for _ in range(5):  # five held requests: admitted at once, the queue still empty
            await asyncio.wait_for(writer.admit(), timeout=10)
        assert writer.backlog == 0
        assert writer.stuck_reason() is None
        for i in range(5):  # they end: each record is queued, past queue_size too
            writer.record({"kind": "request", "request_id": f"r{i}"})
        assert writer.backlog == 5
        with pytest.raises(StoreUnavailable, match="audit"):  # new work waits, then is refused
            await asyncio.wait_for(writer.admit(), timeout=10)
    finally:
        await writer.stop()
        await store.aclose()
    assert writer.stats.lost == 5


async def test_a_chain_that_went_back_is_reported_not_silently_continued(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A failover that lost replicated-late writes, or a store restored from an older backup,
    moves the head back: the writer says so (log and metric) before chaining onto it."""
    port = free_port()
    store = private_redis_store(port)
    writer = writer_for(store)
    with redis_server(port, tmp_path):
        writer.start()
        try:
            for i in range(3):
                await writer.submit({"kind": "request", "request_id": f"r{i}"})
            await until(lambda: writer.backlog == 0)
            first = (await records(store))[0]
            raw = redis.Redis(port=port)
            raw.delete("agw-test:{audit}:stream")
            raw.xadd("agw-test:{audit}:stream", {"r": canonical(first)}, id="1-0")
            raw.hset("agw-test:{audit}:head", mapping={"seq": 1, "hash": str(first["hash"])})
            raw.close()
            await writer.submit({"kind": "request", "request_id": "after"})
            await until(lambda: writer.backlog == 0)
            ids = [r["request_id"] for r in await records(store)]
        finally:
            await writer.stop()
            await store.aclose()
    assert ids == ["r0", "after"]
    assert writer.stats.rolled_back == 2
    assert "went back from seq 3 to seq 1" in caplog.text


async def test_records_that_arrive_while_a_batch_is_written_wait_for_the_next_flush(
    embedded: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under steady load the writer wrote each record or two as it came, one transaction per store
    round trip (4 ms apart at c=1), because a flush went on while records kept arriving; the flush
    interval, there to let a batch accumulate, never came. Now a flush writes what was queued when
    it began."""
    batches: list[int] = []
    first_written = asyncio.Event()
    append = embedded.audit_append

    async def watched_append(head: AuditHead, chunk: list[AuditRecord]) -> bool:
        batches.append(len(chunk))
        if len(batches) == 1:
            await first_written.wait()
        return await append(head, chunk)

    monkeypatch.setattr(embedded, "audit_append", watched_append)
    writer = AuditWriter(embedded, queue_size=100, batch_size=10, flush_interval_s=3600.0)
    writer.start()
    try:
        await writer.submit({"kind": "request", "request_id": "first"})
        await until(lambda: batches == [1])
        await writer.submit({"kind": "request", "request_id": "second"})
        await writer.submit({"kind": "request", "request_id": "third"})
        first_written.set()
        await until(lambda: writer.highest_seq >= 1)
        for _ in range(20):  # turns of the loop in which a second batch would have been started
            await asyncio.sleep(0)
        assert batches == [1]
    finally:
        await writer.stop()  # writes what is left, whatever the interval
    assert batches == [1, 2]
    assert [r["request_id"] for r in await records(embedded)] == ["first", "second", "third"]


class CancelAbsorbingStore(EmbeddedStore):
    """A real store whose append, once, absorbs the cancellation it is waiting in, as a Redis call
    cancelled mid-flush did (tests/e2e/test_quota_exactness.py hung at shutdown on it)."""

    def __init__(self, path: Path) -> None:
        super().__init__(EmbeddedStoreSettings(path=path))
        self.appending = asyncio.Event()
        self._absorbed = False

    async def audit_append(self, head: AuditHead, records: list[AuditRecord]) -> bool:
        if not self._absorbed:
            self._absorbed = True
            self.appending.set()
            with contextlib.suppress(asyncio.CancelledError):  # absorbed: the append goes on
                await asyncio.Event().wait()
        return await super().audit_append(head, records)


async def test_stop_returns_and_flushes_when_a_store_call_absorbs_the_cancellation(tmp_path: Path) -> None:
    store = CancelAbsorbingStore(tmp_path / "data")
    writer = writer_for(store)
    writer.start()
    try:
        writer.record({"kind": "request", "request_id": "in-flight"})
        await asyncio.wait_for(store.appending.wait(), 10)
        stopping = asyncio.create_task(writer.stop())
        done, _ = await asyncio.wait({stopping}, timeout=10)  # on main it waited forever: the task lived on
        assert stopping in done, "stop() did not return"
        assert [r["request_id"] for r in await records(store)] == ["in-flight"]
    finally:
        await store.aclose()
