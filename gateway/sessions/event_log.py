"""The event log of one streamed response: the single record of what the client has been sent.

Every SSE event gets the next sequence number here; the HTTP response, a reconnecting client and
the checkpointer all read from this log, so they cannot disagree about what was sent. Payloads are
the exact bytes of each event's data, in the session's surface's form (which frames them); the
terminal event (`[DONE]`) is an event like any other.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from gateway.deadlines import deadline_in
from gateway.errors import GatewayError

Event = tuple[int, bytes]  # (seq, payload)


class SessionLog:
    def __init__(self, first_seq: int = 1) -> None:
        self.events: list[tuple[int, bytes]] = []
        self.next_seq = first_seq
        self.closed = False
        self.failure: GatewayError | None = None  # failed before the first event: an HTTP error
        # Made by the first reader to wait, set and dropped by the next change: a reader waits on
        # the one it saw, so no wake-up is missed, appending never awaits a lock, and a burst of
        # appends with nobody waiting makes no event at all.
        self._grew: asyncio.Event | None = None

    def append(self, payload: bytes) -> int:
        seq = self.next_seq
        self.next_seq += 1
        self.events.append((seq, payload))
        self._notify()
        return seq

    def extend(self, events: list[tuple[int, bytes]]) -> None:
        """Seed with events recovered from a checkpoint (a takeover continues after them)."""
        self.events.extend(events)
        if events:
            self.next_seq = events[-1][0] + 1

    def close(self) -> None:
        self.closed = True
        self._notify()

    def fail(self, error: GatewayError) -> None:
        self.failure = error
        self.close()

    def _notify(self) -> None:
        grew, self._grew = self._grew, None
        if grew is not None:
            grew.set()

    def _change(self) -> asyncio.Event:
        """The event the next change sets."""
        if self._grew is None:
            self._grew = asyncio.Event()
        return self._grew

    async def started(self) -> None:
        """Wait for the first event or the end."""
        while not (self.events or self.closed):
            await self._change().wait()

    async def follow(self, after_seq: int, idle_s: float | None = None) -> AsyncGenerator[list[Event] | None, None]:
        """Every event with seq > after_seq, then the new ones as they come, until the log closes:
        each time, all the events there are (one write to the client for a burst, never a wait
        for more). None after every `idle_s` without an event (time for a keep-alive)."""
        index = self._index_after(after_seq)
        while True:
            grew = self._change()
            if index < len(self.events):
                # A takeover regenerates events the reader may already have: skip them by seq.
                batch = [event for event in self.events[index:] if event[0] > after_seq]
                index = len(self.events)
                if batch:
                    yield batch
            if self.closed:
                return
            if index == len(self.events):
                try:
                    with deadline_in(idle_s):
                        await grew.wait()
                except TimeoutError:
                    yield None

    def _index_after(self, seq: int) -> int:
        for index, (event_seq, _) in enumerate(self.events):
            if event_seq > seq:
                return index
        return len(self.events)
