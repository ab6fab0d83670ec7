"""Deadlines for the request path's awaits: `asyncio.timeout` without its async machinery.

Python 3.11's `asyncio.timeout` is an async context manager with a state machine: entering and
leaving it make two coroutines, look up the running loop twice and the current task once (each
lookup a `getpid` system call in 3.11), and walk the states: ~4% of a non-streamed request's CPU
at c=1 for the two every request passes through (py-spy), more for a stream's readers, which
arm one per wait. Arming and disarming a timer need no await, so a deadline here is a plain
`with` block: its timer cancels the task when it fires, and leaving the block turns that one
cancellation into TimeoutError, exactly as `asyncio.timeout` does (Task.uncancel; a cancellation
from anyone else goes through as it is).
"""

from __future__ import annotations

import asyncio
from types import TracebackType


class Deadline:
    __slots__ = ("_cancelling", "_expired", "_handle", "_task", "_when")

    def __init__(self, when: float | None) -> None:
        """`when`: the event loop's time (`loop.time()`) at which the block is cut short; None: never."""
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a deadline must be used inside a task")
        self._task = task
        self._when = when
        self._cancelling = 0
        self._expired = False
        self._handle: asyncio.TimerHandle | None = None

    def __enter__(self) -> Deadline:
        self._cancelling = self._task.cancelling()
        if self._when is not None:
            self._handle = self._task.get_loop().call_at(self._when, self._expire)
        return self

    def _expire(self) -> None:
        self._expired = True
        self._task.cancel()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._expired and self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc

    @property
    def expired(self) -> bool:
        return self._expired


def deadline_at(when: float | None) -> Deadline:
    return Deadline(when)


def deadline_in(delay_s: float | None) -> Deadline:
    return Deadline(None if delay_s is None else asyncio.get_running_loop().time() + delay_s)
