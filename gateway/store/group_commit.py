"""Group commit: writes that arrive while one transaction is being written share the next one.

Under load most of a small SQLite write is the transaction around it (BEGIN, the commit writing its
pages to the WAL), so N callers waiting at once cost one transaction, not N; a lone caller is
written at once, as before. Each caller gets its own item's result, or the batch's exception.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


class GroupCommit(Generic[Item, Result]):
    def __init__(self, write: Callable[[list[Item]], Awaitable[list[Result]]]) -> None:
        """`write` stores a batch in one transaction and returns one result per item, in order."""
        self._write = write
        self._pending: list[tuple[Item, asyncio.Future[Result]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def submit(self, item: Item) -> Result:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Result] = loop.create_future()
        self._pending.append((item, done))
        if self._writer is None:
            self._writer = loop.create_task(self._write_pending(), name="group-commit")
        # A caller that goes away cancels only its own future: the batch is written for the others.
        return await done

    async def _write_pending(self) -> None:
        batch: list[tuple[Item, asyncio.Future[Result]]] = []
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    results = await self._write([item for item, _ in batch])
                except Exception as error:  # noqa: BLE001 - not handled here: raised to each caller
                    for _, done in batch:
                        if not done.done():
                            done.set_exception(error)
                    continue
                for (_, done), result in zip(batch, results, strict=True):
                    if not done.done():
                        done.set_result(result)
        finally:
            self._writer = None
            # Only if the writer itself was cancelled (the loop closing): no caller waits forever.
            for _, done in (*batch, *self._pending):
                done.cancel()
            self._pending = []
