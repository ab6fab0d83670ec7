"""A deadline cuts its block short with TimeoutError, as asyncio.timeout does, and nothing else."""

from __future__ import annotations

import asyncio

import pytest

from gateway.deadlines import deadline_at, deadline_in


async def test_a_block_that_overruns_its_deadline_raises_timeout_error() -> None:
    never = asyncio.Event()
    with pytest.raises(TimeoutError), deadline_in(0.01) as deadline:
        await never.wait()
    assert deadline.expired
    current = asyncio.current_task()
    assert current is not None
    assert current.cancelling() == 0  # the cancellation it made was taken back


async def test_a_block_that_ends_in_time_is_left_alone_and_its_timer_is_gone() -> None:
    with deadline_in(3600) as deadline:
        await asyncio.sleep(0)
    assert not deadline.expired
    loop = asyncio.get_running_loop()
    with deadline_at(loop.time() + 0.01):
        pass
    await asyncio.sleep(0.05)  # past the deadline: a timer left armed would cancel this task now
    current = asyncio.current_task()
    assert current is not None
    assert current.cancelling() == 0


async def test_no_deadline_never_expires() -> None:
    with deadline_in(None) as deadline:
        await asyncio.sleep(0)
    assert not deadline.expired


async def test_a_deadline_already_past_expires_at_the_first_await() -> None:
    loop = asyncio.get_running_loop()
    with pytest.raises(TimeoutError), deadline_at(loop.time() - 1):
        await asyncio.sleep(3600)


async def test_a_cancellation_from_outside_is_not_turned_into_a_timeout() -> None:
    started = asyncio.Event()

    async def waits() -> None:
        with deadline_in(3600):
            started.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(waits())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_outside_a_task_there_is_no_deadline() -> None:
    loop = asyncio.get_running_loop()
    raised: asyncio.Future[BaseException] = loop.create_future()

    def in_a_callback() -> None:
        try:
            deadline_in(1)
        except RuntimeError as error:
            raised.set_result(error)

    loop.call_soon(in_a_callback)  # a callback, not a task: there is nothing to cancel
    assert isinstance(await raised, RuntimeError)
