"""Alternating rounds of measured windows, each followed by waiting for the gateway to go quiet.

Checkpoints are written off the request path, so under load a gateway with sessions on can fall
behind and finish its store writes after the last response has gone out. A window's req/s alone
would then leave that work out, and on a small machine it would land in the next gateway's
window instead. So after every window the gateway's CPU is watched until it idles: the time that
takes (the drain) and the CPU it spends are recorded, and "sustained" req/s counts the drain as
part of the window.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from bench.support.procs import Service, rss_bytes, run_time_s
from bench.support.runner import Figures, Limits, PathUnderTest, Scenario, each_window, measure_window

Counter = Callable[[], int]

_POLL_S = 0.05
_QUIET_SHARE = 0.05  # under 5% of one CPU during a poll interval: idle
_DRAIN_CAP_S = 30.0


@dataclass(frozen=True)
class Drain:
    seconds: float  # from the end of the window until the gateway idled (poll resolution 50 ms)
    cpu_s: float  # CPU the gateway spent in that time
    settled: bool  # False: still busy when the cap ran out


async def wait_for_quiet(service: Service) -> Drain:
    started = polled = time.perf_counter()
    first = last = run_time_s(service.pids())
    for _ in range(int(_DRAIN_CAP_S / _POLL_S)):
        await asyncio.sleep(_POLL_S)
        now, cpu = time.perf_counter(), run_time_s(service.pids())
        if cpu - last < _QUIET_SHARE * (now - polled):
            return Drain(polled - started, last - first, True)
        polled, last = now, cpu
    return Drain(time.perf_counter() - started, last - first, False)


@dataclass(frozen=True)
class Window:
    """One measured window plus what came after it."""

    figures: Figures
    drain: Drain
    rss_bytes: int
    # Sessions whose first checkpoint reached the store only after the window's last response:
    # how far the checkpointer was behind (sessions on only).
    backlog: int | None

    @property
    def sustained_rps(self) -> float:
        span = self.figures.elapsed_s + self.drain.seconds
        return self.figures.requests / span if span > 0 else 0.0

    @property
    def cpu_ms_per_req_with_drain(self) -> float | None:
        proxy = self.figures.proxy_cpu_ms_per_req
        n = self.figures.requests
        return None if proxy is None or not n else proxy + self.drain.cpu_s * 1000 / n


def _progress(window: Window) -> None:
    f, d = window.figures, window.drain
    errors = f" ERRORS {f.errors} {f.error_kinds}" if f.errors else ""
    print(
        f"  round {f.round} {f.scenario:<12} {f.path:<22} {f.requests:>5} req {f.rps:>6.0f}/s "
        f"p50 {f.p50_ms:6.2f} ms ttft {f.ttft_p50_ms or 0:6.2f} | drain {d.seconds:.1f} s "
        f"{d.cpu_s:.2f} CPU-s, backlog {window.backlog} -> sustained {window.sustained_rps:.0f}/s{errors}",
        file=sys.stderr,
        flush=True,
    )


async def _count(counter: Counter | None) -> int | None:
    return None if counter is None else await asyncio.to_thread(counter)


async def measure(
    round_no: int, scenario: Scenario, path: PathUnderTest, upstream: Service, limits: Limits, counter: Counter | None
) -> Window:
    assert path.proxy is not None
    await wait_for_quiet(path.proxy)  # whatever came before (start-up, another window) is done
    figures = await measure_window(round_no, scenario, path, upstream, limits)
    at_end = await _count(counter)
    drain = await wait_for_quiet(path.proxy)
    final = await _count(counter)
    backlog = final - at_end if final is not None and at_end is not None else None
    return Window(figures, drain, rss_bytes(path.proxy.pids()), backlog)


async def run_rounds(
    rounds: int,
    scenarios: Sequence[Scenario],
    paths: Sequence[PathUnderTest],
    upstream: Service,
    limits: Limits,
    counters: Mapping[str, Counter],
) -> list[Window]:
    """`counters[path name]` counts the sessions that gateway has checkpointed (sessions on only)."""

    async def one(round_no: int, scenario: Scenario, path: PathUnderTest) -> Window:
        return await measure(round_no, scenario, path, upstream, limits, counters.get(path.name))

    return await each_window(rounds, scenarios, paths, one, _progress)
