"""Group commit: callers arriving while a batch is written share the next write; each gets its own
result or the batch's error; a caller that leaves does not cancel the others' write."""

from __future__ import annotations

import asyncio

import pytest

from gateway.store.group_commit import GroupCommit


class Writer:
    """Records each batch; holds a write open until released, so callers can pile up behind it."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.writing = asyncio.Event()
        self.release = asyncio.Event()
        self.fail_next: Exception | None = None

    async def write(self, items: list[int]) -> list[str]:
        self.batches.append(items)
        self.writing.set()
        await self.release.wait()
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error
        return [f"stored {item}" for item in items]


async def test_a_lone_write_goes_at_once_and_gets_its_own_result() -> None:
    writer = Writer()
    writer.release.set()
    commit = GroupCommit(writer.write)
    assert await asyncio.wait_for(commit.submit(1), 5) == "stored 1"
    assert writer.batches == [[1]]


async def test_callers_arriving_during_a_write_share_the_next_one() -> None:
    writer = Writer()
    commit = GroupCommit(writer.write)
    first = asyncio.create_task(commit.submit(1))
    await asyncio.wait_for(writer.writing.wait(), 5)
    later = [asyncio.create_task(commit.submit(n)) for n in (2, 3, 4)]
    await asyncio.sleep(0)
    writer.release.set()
    assert await asyncio.wait_for(asyncio.gather(first, *later), 5) == [f"stored {n}" for n in (1, 2, 3, 4)]
    assert writer.batches == [[1], [2, 3, 4]]


async def test_a_failed_write_fails_each_of_its_callers_and_the_next_batch_is_written() -> None:
    writer = Writer()
    commit = GroupCommit(writer.write)
    writer.fail_next = OSError("disk full")
    first = asyncio.create_task(commit.submit(1))
    await asyncio.wait_for(writer.writing.wait(), 5)
    second = asyncio.create_task(commit.submit(2))
    await asyncio.sleep(0)
    writer.release.set()
    with pytest.raises(OSError, match="disk full"):
        await asyncio.wait_for(first, 5)
    assert await asyncio.wait_for(second, 5) == "stored 2"


async def test_a_caller_that_leaves_does_not_cancel_the_write_for_the_others() -> None:
    writer = Writer()
    commit = GroupCommit(writer.write)
    first = asyncio.create_task(commit.submit(1))
    await asyncio.wait_for(writer.writing.wait(), 5)
    leaving = asyncio.create_task(commit.submit(2))
    staying = asyncio.create_task(commit.submit(3))
    await asyncio.sleep(0)
    leaving.cancel()
    writer.release.set()
    assert await asyncio.wait_for(first, 5) == "stored 1"
    assert await asyncio.wait_for(staying, 5) == "stored 3"
    assert leaving.cancelled()
    assert writer.batches == [[1], [2, 3]]
