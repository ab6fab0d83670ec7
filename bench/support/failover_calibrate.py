"""What the drill's figures contain that is not the gateway's: measured with no gateway in between.

- The sim's own TTFT as a client sees it (the configured TTFT plus the sim's HTTP overhead and
  timer rounding): the recovery figure subtracts the configured value, so any excess is in it.
- SIGKILL to the end of the connection, directly: the kernel tears down the killed process's
  memory before it closes its sockets, so a killed backend is noticed a few ms after the signal
  by any client, gateway or not.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import httpx

from bench.support.failover_fleet import SimTiming, kill_now, start_sim
from bench.support.procs import Service
from bench.support.sse_client import Hook, StreamRecord, stream_chat


@dataclasses.dataclass(frozen=True)
class Calibration:
    direct_ttft_ms: list[float]
    direct_gap_ms: list[float]  # mean gap between tokens, per stream
    kill_to_eof_ms: list[float]


def _gap_ms(record: StreamRecord) -> float | None:
    times = record.token_times
    return (times[-1] - times[0]) * 1000 / (len(times) - 1) if len(times) > 1 else None


async def direct_streams(sim: Service, body: dict[str, Any], count: int) -> tuple[list[float], list[float]]:
    ttfts: list[float] = []
    gaps: list[float] = []
    async with httpx.AsyncClient(base_url=sim.url, timeout=15) as client:
        await stream_chat(client, body, "calibrate-warm-up")
        for i in range(count):
            record = await stream_chat(client, body, f"calibrate-{i}")
            if record.token_times:
                ttfts.append((record.token_times[0] - record.started) * 1000)
            if (gap := _gap_ms(record)) is not None:
                gaps.append(gap)
    return ttfts, gaps


async def _one_kill(workdir: Path, timing: SimTiming, body: dict[str, Any], k: int) -> float | None:
    sim = await asyncio.to_thread(start_sim, workdir, "calibrate-kill", timing)
    try:
        async with httpx.AsyncClient(base_url=sim.url, timeout=15) as client:
            await stream_chat(client, body, "calibrate-warm-up")  # the connection is open before the drill
            record = await stream_chat(client, body, "calibrate-kill", Hook(k, lambda: kill_now(sim)))
    finally:
        await asyncio.to_thread(sim.stop)
    return (record.ended - record.hook_time) * 1000 if record.hook_time is not None else None


async def kill_to_eof(workdir: Path, timing: SimTiming, body: dict[str, Any], count: int, k: int) -> list[float]:
    found = []
    for _ in range(count):
        if (value := await _one_kill(workdir, timing, body, k)) is not None:
            found.append(value)
    return found


async def calibrate(workdir: Path, sim: Service, timing: SimTiming, body: dict[str, Any]) -> Calibration:
    ttfts, gaps = await direct_streams(sim, body, count=10)
    kills = await kill_to_eof(workdir, timing, body, count=5, k=10)
    return Calibration(ttfts, gaps, kills)
