"""Load shapes: when each request is sent, bounded in count and in time.

- concurrency: a closed loop; a new request starts as soon as one of N finishes.
- rate: an open loop with Poisson arrivals (exponential gaps from a seeded generator).
- original: the samples' own timestamps, gaps multiplied by the time scale.

Open loops still cap the requests in flight (the connection pool's size): a request due while the
cap is reached waits, and that wait shows up as its late `start_s`. Each record keeps how late it
was dispatched against when it was due (its offset, or the moment a client came free when it had to
wait for one): the tool's own lateness, which changes the offered load. Dispatching stops after
`count` requests or `duration_s`, whichever comes first, or as soon as the first answer is a 404
while nothing has succeeded (an unknown model or a wrong URL: every request would get the same);
requests still running `drain_s` later are cancelled and recorded as such, so a run never outlives
duration + drain.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

import httpx

from replay.client import ClientConfig, ClientPool, send_one
from replay.lag import LagMonitor
from replay.record import CANCELLED, RequestRecord
from replay.samples import Prepared

MODES = ("concurrency", "rate", "original")
# The progress line is redrawn in place on a terminal; in a log a line is written less often, so
# that a long run leaves a readable log rather than thousands of lines.
TTY_INTERVAL_S = 0.5
LOG_INTERVAL_S = 5.0


@dataclass(slots=True)
class Counts:
    """Updated by the runner as requests start and end."""

    sent: int = 0
    done: int = 0
    failed: int = 0

    @property
    def in_flight(self) -> int:
        return self.sent - self.done


class Progress:
    """The live progress line on stderr, redrawn at most every interval."""

    def __init__(self, total: int, counts: Counts, out: TextIO | None = None) -> None:
        self._total = total
        self._counts = counts
        self._out = out if out is not None else sys.stderr
        self._tty = self._out.isatty()
        self._interval_s = TTY_INTERVAL_S if self._tty else LOG_INTERVAL_S
        self._started = time.perf_counter()

    def line(self) -> str:
        counts, elapsed = self._counts, time.perf_counter() - self._started
        rate = counts.done / elapsed if elapsed > 0 else 0.0
        return (
            f"[{elapsed:6.1f}s] sent {counts.sent}/{self._total}  done {counts.done}  "
            f"failed {counts.failed}  in flight {counts.in_flight}  {rate:.1f} req/s"
        )

    async def run(self, max_s: float) -> None:
        """Redraw until cancelled or `max_s` has passed (the run's own time bound)."""
        deadline = time.perf_counter() + max_s
        while time.perf_counter() < deadline:
            await asyncio.sleep(self._interval_s)
            self._draw()

    def close(self) -> None:
        self._draw()
        if self._tty:
            self._out.write("\n")
            self._out.flush()

    def _draw(self) -> None:
        if self._tty:
            self._out.write("\r\x1b[2K" + self.line())
        else:
            self._out.write(self.line() + "\n")
        self._out.flush()


@dataclass(frozen=True, slots=True)
class LoadPlan:
    mode: str = "concurrency"
    concurrency: int = 1  # closed-loop workers, or the in-flight cap of the open-loop modes
    count: int = 1
    duration_s: float = 300.0
    drain_s: float = 30.0
    rate: float | None = None
    time_scale: float = 1.0
    seed: int = 0


def arrival_offsets(plan: LoadPlan, timestamps: Sequence[float | None]) -> list[float] | None:
    """Seconds from the start at which request i is due; None for the closed loop."""
    if plan.mode == "concurrency":
        return None
    if plan.mode == "rate":
        if plan.rate is None or plan.rate <= 0:
            raise ValueError("rate mode needs a positive rate")
        draw = random.Random(plan.seed)
        offsets, at = [], 0.0
        for _ in range(plan.count):
            offsets.append(at)
            at += draw.expovariate(plan.rate)
        return offsets
    known = [t for t in timestamps[: plan.count] if t is not None]
    if len(known) < min(plan.count, len(timestamps)):
        raise ValueError("original timing needs a timestamp on every sample")
    first = min(known)
    return [(t - first) * plan.time_scale for t in known]


def order_for_plan(plan: LoadPlan, timestamps: Sequence[float | None]) -> list[int]:
    """Sample index of each request (one timestamp, maybe None, per sample): in timestamp order
    once through for original timing, otherwise file order, wrapping around past the end."""
    if plan.mode == "original":
        ordered = sorted(range(len(timestamps)), key=lambda i: (timestamps[i] is None, timestamps[i] or 0.0))
        return ordered[: plan.count]
    return [i % len(timestamps) for i in range(plan.count)]


@dataclass(slots=True)
class RunResult:
    records: list[RequestRecord]
    wall_s: float
    started_at: float  # unix time of the first dispatch
    lag: LagMonitor
    origin: float  # perf_counter of the run's start; records' start_s count from it
    aborted: str | None = None  # why dispatching stopped early, when it did


class Runner:
    """One run: dispatches requests per the plan and collects their records."""

    def __init__(
        self,
        pool: ClientPool,
        config: ClientConfig,
        plan: LoadPlan,
        requests: Sequence[Prepared],
        offsets: Sequence[float] | None,
        show_progress: bool = False,
    ) -> None:
        self._pool, self._config, self._plan = pool, config, plan
        self._requests, self._offsets = requests, offsets
        self.counts = Counts()
        self._progress = Progress(len(requests), self.counts) if show_progress else None
        self._records: list[RequestRecord] = []
        self._in_flight: dict[int, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._crashes: list[BaseException] = []
        self._origin = time.perf_counter()
        self._last_done = self._origin
        self._succeeded = 0
        self._aborted: str | None = None

    async def run(self) -> RunResult:
        lag = LagMonitor()
        lag.start()
        started_at, self._origin = time.time(), time.perf_counter()
        self._last_done = self._origin
        bound_s = self._plan.duration_s + self._plan.drain_s
        background = [asyncio.ensure_future(self._progress.run(bound_s))] if self._progress else []
        try:
            await self._dispatch()
            await self._drain()
        finally:
            background += self._tasks
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            await lag.stop()
            if self._progress is not None:
                self._progress.close()
        if self._crashes:
            # send_one classifies every server behaviour; an exception here is a bug in the tool.
            raise self._crashes[0]
        self._records.sort(key=lambda record: record.index)
        return RunResult(self._records, self._last_done - self._origin, started_at, lag, self._origin, self._aborted)

    async def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        end = start + self._plan.duration_s
        for index, prepared in enumerate(self._requests):
            offset = self._offsets[index] if self._offsets is not None else 0.0
            due = start + offset
            if due >= end or self._aborted is not None:
                break
            await asyncio.sleep(max(0.0, due - loop.time()))
            try:
                # The pool holds `concurrency` clients: waiting for one is the in-flight cap.
                async with asyncio.timeout_at(end):
                    http, freed = await self._pool.acquire()
            except TimeoutError:
                break
            if self._aborted is not None:
                self._pool.release(http)
                break
            # Due at its scheduled offset, or later if no client was free until then.
            due_s = max(offset, (freed - self._origin) if freed is not None else 0.0)
            task = loop.create_task(self._one(index, prepared, http, due_s))
            self._tasks.add(task)
            task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        error = None if task.cancelled() else task.exception()
        if error is not None:
            self._crashes.append(error)

    async def _one(self, index: int, prepared: Prepared, http: httpx.AsyncClient, due_s: float) -> None:
        self.counts.sent += 1
        self._in_flight[index] = time.perf_counter() - self._origin
        try:
            record = await send_one(http, self._config, prepared, index, self._origin)
        finally:
            self._pool.release(http)
        del self._in_flight[index]
        record.dispatch_late_s = max(0.0, record.start_s - due_s)
        self._succeeded += 1 if record.ok else 0
        if record.status == 404 and self._succeeded == 0 and self._aborted is None:
            # Every other request would get the same answer (an unknown model, a wrong base URL):
            # stop sending rather than report a run of 404s.
            self._aborted = (
                f"the first answer was HTTP 404 and nothing had succeeded, so no more requests were sent "
                f"({record.detail[:160]}); check the model name (--model) and --base-url"
            )
        self._records.append(record)
        self.counts.done += 1
        self.counts.failed += 0 if record.ok else 1
        self._last_done = time.perf_counter()

    async def _drain(self) -> None:
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=self._plan.drain_s)
        for index, start_s in sorted(self._in_flight.items()):
            prepared = self._requests[index]
            record = RequestRecord(index, prepared.sample_id, prepared.stream, start_s)
            record.reason, record.detail = CANCELLED, f"still running {self._plan.drain_s:g} s after dispatch ended"
            self._records.append(record)
        if self._in_flight:
            self._last_done = time.perf_counter()
