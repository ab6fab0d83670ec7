"""What each feature contributes to the process: its routes, and what runs while it serves.

A `Part` names what a builder adds to the app; `running(parts)` starts every part's work in
build order and stops it in reverse through one exit stack, so a failing stop does not skip the
others, and a failing start stops what had already started.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter
from starlette.routing import BaseRoute

log = logging.getLogger(__name__)

Running = Callable[[], contextlib.AbstractAsyncContextManager[None]]
"""Something that runs while the process serves: entered at start-up, exited at shutdown."""

# A background loop is cancelled at shutdown; one that absorbs the cancellation (a store call
# can) is cancelled again, for at most this long, then left with an error in the log.
_CANCEL_WITHIN_S = 5.0


@dataclass(frozen=True, slots=True)
class Part:
    routes: Sequence[BaseRoute] = ()
    routers: Sequence[APIRouter] = ()
    running: Sequence[Running] = ()


def started(start: Callable[[], object], stop: Callable[[], Awaitable[object]]) -> Running:
    """`start()` at start-up, `await stop()` at shutdown."""

    @contextlib.asynccontextmanager
    async def run() -> AsyncIterator[None]:
        start()
        try:
            yield
        finally:
            await stop()

    return run


def closed_at_exit(close: Callable[[], Awaitable[object]]) -> Running:
    """Nothing to start; `await close()` at shutdown."""
    return started(lambda: None, close)


def background(loop: Callable[[], Coroutine[Any, Any, object]], name: str) -> Running:
    """A task running `loop()` from start-up, cancelled at shutdown."""

    @contextlib.asynccontextmanager
    async def run() -> AsyncIterator[None]:
        task = asyncio.get_running_loop().create_task(loop(), name=name)
        try:
            yield
        finally:
            await _cancelled(task)

    return run


async def _cancelled(task: asyncio.Task[object]) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _CANCEL_WITHIN_S
    while not task.done() and loop.time() < deadline:
        task.cancel()
        await asyncio.wait({task}, timeout=0.1)
    if not task.done():
        log.error("background task %s did not stop within %.0f s of being cancelled", task.get_name(), _CANCEL_WITHIN_S)
    elif not task.cancelled() and task.exception() is not None:
        log.error("background task %s had failed", task.get_name(), exc_info=task.exception())


@contextlib.asynccontextmanager
async def running(parts: Sequence[Part]) -> AsyncIterator[None]:
    async with contextlib.AsyncExitStack() as stack:
        for part in parts:
            for run in part.running:
                await stack.enter_async_context(run())
        yield
