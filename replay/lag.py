"""How late the replay tool's own event loop runs, and whether that spoils its figures.

Every timestamp the tool takes is taken by a callback on its event loop; when the loop is busy,
the callback runs late and the timestamp is late by the same amount. A ticker that asks to wake
every few milliseconds and records how late it actually woke measures exactly that delay.

The ticker's own resolution is about 1 ms (the selector rounds its timeout up to whole
milliseconds), so a limit below `MIN_LAG_LIMIT_S` cannot be judged and is raised to it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from replay.metrics import percentile

MIN_LAG_LIMIT_S = 0.002
DEFAULT_INTERVAL_S = 0.005
# One hour of ticks at the default interval; a run is bounded well below that.
DEFAULT_MAX_SAMPLES = 720_000


@dataclass(frozen=True, slots=True)
class LagVerdict:
    samples: int
    p50_s: float | None
    p99_s: float | None
    max_s: float | None
    limit_s: float
    valid: bool
    reason: str

    def to_json(self) -> dict[str, object]:
        return {
            "samples": self.samples,
            "p50_ms": _ms(self.p50_s),
            "p99_ms": _ms(self.p99_s),
            "max_ms": _ms(self.max_s),
            "limit_ms": _ms(self.limit_s),
            "valid": self.valid,
            "reason": self.reason,
        }


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 3)


class LagMonitor:
    """Start with `start()`, stop with `await stop()`; `lags_s` holds one lateness per tick."""

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S, max_samples: int = DEFAULT_MAX_SAMPLES) -> None:
        self.interval_s = interval_s
        self.max_samples = max_samples
        self.lags_s: list[float] = []
        self._task: asyncio.Task[None] | None = None
        self._due: float | None = None

    def start(self) -> None:
        self._due = time.perf_counter() + self.interval_s
        self._task = asyncio.get_running_loop().create_task(self._tick())

    async def stop(self) -> None:
        if self._task is None:
            return
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._task = None
        # A tick that was already overdue at the end still tells how late the loop was.
        now = time.perf_counter()
        if self._due is not None and now > self._due and len(self.lags_s) < self.max_samples:
            self.lags_s.append(now - self._due)

    async def _tick(self) -> None:
        # perf_counter, not loop.time(): uvloop's clock only has millisecond resolution.
        while self._due is not None and len(self.lags_s) < self.max_samples:
            await asyncio.sleep(max(0.0, self._due - time.perf_counter()))
            now = time.perf_counter()
            self.lags_s.append(max(0.0, now - self._due))
            # From the actual wake-up, so one long stall counts once rather than as a backlog.
            self._due = now + self.interval_s

    def verdict(self, ttft_p50_s: float | None, max_lag_s: float, ttft_fraction: float) -> LagVerdict:
        return judge_lag(self.lags_s, ttft_p50_s, max_lag_s, ttft_fraction)


def judge_lag(lags_s: list[float], ttft_p50_s: float | None, max_lag_s: float, ttft_fraction: float) -> LagVerdict:
    """Valid when the lag p99 stays within min(max_lag, fraction x TTFT p50), floored at the
    ticker's resolution: past that, the lag is a visible share of the TTFT being reported."""
    limit = max_lag_s
    if ttft_p50_s is not None:
        limit = min(limit, ttft_fraction * ttft_p50_s)
    limit = max(limit, MIN_LAG_LIMIT_S)
    ordered = sorted(lags_s)
    if not ordered:
        return LagVerdict(0, None, None, None, limit, True, "no tick fell due: the run was shorter than one tick")
    p99 = percentile(ordered, 99)
    valid = p99 <= limit
    reason = (
        f"lag p99 {p99 * 1000:.2f} ms within the {limit * 1000:.2f} ms limit"
        if valid
        else f"lag p99 {p99 * 1000:.2f} ms exceeds the {limit * 1000:.2f} ms limit: timings are distorted"
    )
    return LagVerdict(len(ordered), percentile(ordered, 50), p99, ordered[-1], limit, valid, reason)
