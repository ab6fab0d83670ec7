"""The event log a streamed answer's readers follow: bursts come out as one batch (one write to
the client), nothing is lost or repeated, and an idle log asks for a keep-alive."""

from __future__ import annotations

import asyncio

from gateway.sessions.event_log import SessionLog


async def test_events_already_there_come_as_one_batch_after_the_given_seq() -> None:
    log = SessionLog()
    for payload in (b"a", b"b", b"c"):
        log.append(payload)
    log.close()
    assert [batch async for batch in log.follow(after_seq=1)] == [[(2, b"b"), (3, b"c")]]


async def test_a_reader_gets_each_event_once_however_the_appends_interleave() -> None:
    log = SessionLog()
    got: list[tuple[int, bytes]] = []
    batches = 0

    async def read() -> None:
        nonlocal batches
        async for batch in log.follow(after_seq=0):
            assert batch is not None
            got.extend(batch)
            batches += 1

    reader = asyncio.create_task(read())
    for burst in range(5):
        for n in range(burst + 1):  # bursts of 1..5 appended without yielding to the reader
            log.append(b"%d.%d" % (burst, n))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
    log.close()
    await asyncio.wait_for(reader, 5)
    assert [seq for seq, _ in got] == list(range(1, 16))
    assert batches <= 5 + 1, "a burst is one batch"


async def test_an_idle_log_yields_none_for_a_keep_alive() -> None:
    log = SessionLog()
    follow = log.follow(after_seq=0, idle_s=0.01)
    assert await asyncio.wait_for(anext(follow), 5) is None
    log.append(b"x")
    assert await asyncio.wait_for(anext(follow), 5) == [(1, b"x")]
    await follow.aclose()
