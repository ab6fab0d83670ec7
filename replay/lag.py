"""How much of each request's timing is the replay tool's own doing, per request.

Every timestamp the tool takes is taken by code on its event loop; when the loop is busy (other
streams' reads, a garbage collection, the process descheduled on a loaded machine) a read's
timestamp is late by as long as the loop was unavailable. TTFT's clock starts before the request is
written, so such delays can only make a figure read high, never low; this module says by how much
for each request, so that only the requests it affects are left out of the latency figures.

A ticker asks to wake every `interval_s` and records when each wake-up was due and when it came:
the ticks are back to back, so at any moment the last tick due at or before it tells how long the
loop had been unavailable around then. A request's client delay is the largest of:

- its write delay: from the start of its clock to the whole request written (time the loop spent
  elsewhere while the request was being handed to the socket, all of it inside TTFT);
- the loop's stall at the read that delivered its first output (inflates TTFT);
- the loop's stall at its last read (inflates E2E and TPOT).

A request whose client delay exceeds max(`floor_s`, `fraction` x its TTFT) is excluded from the
latency figures and counted; the rest of the run stands. The ticker's resolution is about 1 ms
(timers are rounded to whole milliseconds), hence the floor.

How late each request was dispatched against its schedule is recorded alongside: it changes the
offered load (fewer requests in flight than planned), not any request's latency.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections.abc import Sequence
from dataclasses import dataclass

from replay.record import RequestRecord

DEFAULT_INTERVAL_S = 0.001
DEFAULT_FLOOR_S = 0.002
DEFAULT_FRACTION = 0.03
# One hour of ticks at the default interval; a run is bounded well below that.
DEFAULT_MAX_TICKS = 3_600_000


@dataclass(frozen=True, slots=True)
class DelayLimit:
    floor_s: float = DEFAULT_FLOOR_S
    fraction: float = DEFAULT_FRACTION

    def for_ttft(self, ttft_s: float | None) -> float:
        return max(self.floor_s, self.fraction * (ttft_s or 0.0))

    def describe(self) -> str:
        return f"max({self.floor_s * 1000:g} ms, {self.fraction:.0%} of the request's TTFT)"


class LagMonitor:
    """Start with `start()`, stop with `await stop()`; `due` and `woke` hold one tick each
    (perf_counter seconds), `stall_at` reads them."""

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S, max_ticks: int = DEFAULT_MAX_TICKS) -> None:
        self.interval_s = interval_s
        self.max_ticks = max_ticks
        self.due: list[float] = []
        self.woke: list[float] = []
        self._task: asyncio.Task[None] | None = None
        self._next: float | None = None

    def start(self) -> None:
        self._next = time.perf_counter() + self.interval_s
        self._task = asyncio.get_running_loop().create_task(self._tick())

    async def stop(self) -> None:
        if self._task is None:
            return
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._task = None
        # A tick that was already overdue at the end still tells how late the loop was.
        now = time.perf_counter()
        if self._next is not None and now > self._next and len(self.due) < self.max_ticks:
            self.due.append(self._next)
            self.woke.append(now)

    async def _tick(self) -> None:
        # perf_counter, not loop.time(): uvloop's clock only has millisecond resolution.
        while self._next is not None and len(self.due) < self.max_ticks:
            await asyncio.sleep(max(0.0, self._next - time.perf_counter()))
            now = time.perf_counter()
            self.due.append(self._next)
            self.woke.append(max(now, self._next))
            # From the actual wake-up, so one long stall counts once rather than as a backlog.
            self._next = now + self.interval_s

    def stall_at(self, moment: float) -> float:
        """How long the loop had owed the ticker at `moment`: from the last tick due at or before it
        to that tick's wake-up or `moment`, whichever came first (a stall after the read did not
        delay it)."""
        index = bisect.bisect_right(self.due, moment) - 1
        return max(0.0, min(self.woke[index], moment) - self.due[index]) if index >= 0 else 0.0

    def lateness(self) -> list[float]:
        return [woke - due for due, woke in zip(self.due, self.woke, strict=True)]


def assess(records: Sequence[RequestRecord], monitor: LagMonitor, origin: float, limit: DelayLimit) -> None:
    """Set each record's client delay and whether its timing is trustworthy (in place)."""
    for record in records:
        if record.setup_s is None:
            continue
        sent = origin + record.start_s + record.setup_s
        delays = [record.write_delay_s or 0.0]
        if record.ttft_s is not None:
            delays.append(monitor.stall_at(sent + record.ttft_s))
        if record.e2e_s is not None:
            delays.append(monitor.stall_at(sent + record.e2e_s))
        record.client_delay_s = max(delays)
        record.timing_ok = record.client_delay_s <= limit.for_ttft(record.ttft_s)
