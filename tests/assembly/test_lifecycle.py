"""What each feature runs starts in build order and stops in reverse, whatever fails on the way."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from gateway.assembly.lifecycle import Part, background, closed_at_exit, running, started


def recording(log: list[str], name: str, *, fail_stop: bool = False) -> Part:
    async def stop() -> None:
        log.append(f"stop {name}")
        if fail_stop:
            raise RuntimeError(f"{name} failed to stop")

    return Part(running=(started(lambda: log.append(f"start {name}"), stop),))


async def test_parts_start_in_build_order_and_stop_in_reverse() -> None:
    log: list[str] = []
    async with running([recording(log, "store"), recording(log, "audit"), recording(log, "sessions")]):
        log.append("serving")
    assert log == [
        "start store",
        "start audit",
        "start sessions",
        "serving",
        "stop sessions",
        "stop audit",
        "stop store",
    ]


async def test_a_failing_stop_does_not_skip_the_parts_stopped_after_it() -> None:
    log: list[str] = []
    with pytest.raises(RuntimeError, match="audit failed to stop"):
        async with running([recording(log, "store"), recording(log, "audit", fail_stop=True)]):
            pass
    assert log[-2:] == ["stop audit", "stop store"]


async def test_a_failing_start_stops_what_had_already_started() -> None:
    log: list[str] = []

    def refuse() -> None:
        raise RuntimeError("no port")

    async def nothing() -> None:
        pass

    broken = Part(running=(started(refuse, nothing),))
    with pytest.raises(RuntimeError, match="no port"):
        async with running([recording(log, "store"), broken, recording(log, "never")]):
            log.append("serving")
    assert log == ["start store", "stop store"]


async def test_a_background_loop_that_absorbs_its_cancellation_is_cancelled_again() -> None:
    absorbed, closed = asyncio.Event(), asyncio.Event()

    async def stubborn() -> None:
        with contextlib.suppress(asyncio.CancelledError):  # once, as a store call cancelled mid-flight can
            await asyncio.Event().wait()
        absorbed.set()
        await asyncio.Event().wait()

    async def close() -> None:
        closed.set()

    part = Part(running=(closed_at_exit(close), background(stubborn, "stubborn")))
    async with running([part]):
        await asyncio.sleep(0)
    assert absorbed.is_set()
    assert closed.is_set()  # stopped after the loop, so reached only once the loop ended
