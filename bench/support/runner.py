"""Measured windows: one scenario on one path, with a warm-up, and what it cost each process.

Rounds alternate the paths inside every scenario (direct, gateway, litellm, direct, ...), so that
a burst of noise on this shared machine lands on all of them alike rather than on one path's
whole block of windows.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

import orjson

from bench.support.fast_upstream import TOKEN
from bench.support.loadgen import MESSAGES_CONTENT, RESPONSES_CONTENT, Pool, Spec, Window, render_request
from bench.support.procs import Service, cpu_seconds

T = TypeVar("T")


@dataclass(frozen=True)
class Scenario:
    name: str
    stream: bool
    concurrency: int
    requests: int


@dataclass(frozen=True)
class PathUnderTest:
    name: str  # direct, floor, gateway, litellm or portkey
    url: str  # base URL, without /v1
    proxy: Service | None  # the process between the client and the upstream; None for direct
    api_key: str = "sk-bench"  # the upstream takes any
    headers: tuple[tuple[str, str], ...] = ()  # more request headers (Portkey is told its upstream this way)
    streams: bool = True  # False: the path fails streaming here, so only non-streaming scenarios run on it
    # Or "responses" (POST /v1/responses, kept: store true as by default), "responses-unkept"
    # (store: false), "messages" (POST /v1/messages): the gateway only.
    api: str = "chat"


@dataclass(frozen=True)
class Limits:
    time_cap_s: float  # per measured window
    warmup_requests: int
    warmup_cap_s: float
    chunks: int


@dataclass
class Figures:
    """One measured window, as written to the JSON results."""

    round: int
    scenario: str
    path: str
    requests: int
    errors: int
    error_kinds: dict[str, int]
    elapsed_s: float
    rps: float
    p50_ms: float
    p99_ms: float
    ttft_p50_ms: float | None
    gap_ms: float | None  # mean gap between consecutive content chunks of a stream
    proxy_cpu_ms_per_req: float | None
    upstream_cpu_ms_per_req: float
    loadgen_cpu_ms_per_req: float


def _responses_body(model: str, stream: bool, store: bool = True) -> bytes:
    body: dict[str, object] = {"model": model, "input": "Say something."}
    if not store:
        body["store"] = False
    if stream:
        body["stream"] = True
    return orjson.dumps(body)


def _messages_body(model: str, stream: bool) -> bytes:
    body: dict[str, object] = {
        "model": model,
        "max_tokens": 1024,
        "messages": [{"role": "user", "content": "Say something."}],
    }
    if stream:
        body["stream"] = True
    return orjson.dumps(body)


def _body(model: str, stream: bool) -> bytes:
    body: dict[str, object] = {"model": model, "messages": [{"role": "user", "content": "Say something."}]}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return orjson.dumps(body)


def make_spec(path: PathUnderTest, scenario: Scenario, chunks: int) -> Spec:
    parts = urlsplit(path.url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    expected = (TOKEN * chunks).encode()
    if path.api in ("responses", "responses-unkept"):
        body = _responses_body("fast", scenario.stream, store=path.api == "responses")
        request = render_request(host, port, "/v1/responses", path.api_key, body, path.headers)
        return Spec(host, port, request, scenario.stream, chunks, expected, RESPONSES_CONTENT)
    if path.api == "messages":
        body = _messages_body("fast", scenario.stream)
        request = render_request(host, port, "/v1/messages", path.api_key, body, path.headers)
        return Spec(host, port, request, scenario.stream, chunks, expected, MESSAGES_CONTENT)
    body = _body("fast", scenario.stream)
    request = render_request(host, port, "/v1/chat/completions", path.api_key, body, path.headers)
    return Spec(host, port, request, scenario.stream, chunks, expected)


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _mean_gap_s(window: Window) -> float | None:
    # Sum of (last - first) over sum of gaps: every gap of every stream weighs the same.
    spans = [(s.chunk_times_s[-1] - s.chunk_times_s[0], len(s.chunk_times_s) - 1) for s in window.samples]
    gaps = sum(n for _, n in spans)
    return sum(span for span, _ in spans) / gaps if gaps else None


@dataclass(frozen=True)
class _Cpu:
    proxy: float
    upstream: float
    loadgen: float

    @classmethod
    def now(cls, path: PathUnderTest, upstream: Service) -> _Cpu:
        proxy = cpu_seconds(path.proxy.pids()) if path.proxy is not None else 0.0
        return cls(proxy, cpu_seconds(upstream.pids()), time.process_time())


def _per_request_ms(before: float, after: float, requests: int) -> float:
    return (after - before) * 1000 / requests if requests else float("nan")


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1000


def summarize(
    round_no: int, scenario: Scenario, path: PathUnderTest, window: Window, cpu: tuple[_Cpu, _Cpu]
) -> Figures:
    latencies = [s.latency_s for s in window.samples]
    ttfts = [t for s in window.samples if (t := s.ttft_s) is not None]
    n = len(window.samples)
    before, after = cpu
    return Figures(
        round=round_no,
        scenario=scenario.name,
        path=path.name,
        requests=n,
        errors=sum(window.errors.values()),
        error_kinds=dict(window.errors.most_common(5)),
        elapsed_s=window.elapsed_s,
        rps=n / window.elapsed_s if window.elapsed_s > 0 else 0.0,
        p50_ms=_percentile(latencies, 0.5) * 1000,
        p99_ms=_percentile(latencies, 0.99) * 1000,
        ttft_p50_ms=_percentile(ttfts, 0.5) * 1000 if scenario.stream and ttfts else None,
        gap_ms=_ms(_mean_gap_s(window)) if scenario.stream else None,
        proxy_cpu_ms_per_req=_per_request_ms(before.proxy, after.proxy, n) if path.proxy else None,
        upstream_cpu_ms_per_req=_per_request_ms(before.upstream, after.upstream, n),
        loadgen_cpu_ms_per_req=_per_request_ms(before.loadgen, after.loadgen, n),
    )


async def measure_window(
    round_no: int, scenario: Scenario, path: PathUnderTest, upstream: Service, limits: Limits
) -> Figures:
    spec = make_spec(path, scenario, limits.chunks)
    async with Pool.open(spec, scenario.concurrency) as pool:
        await pool.run(max(limits.warmup_requests, scenario.concurrency), limits.warmup_cap_s)
        before = _Cpu.now(path, upstream)
        window = await pool.run(scenario.requests, limits.time_cap_s)
        after = _Cpu.now(path, upstream)
    return summarize(round_no, scenario, path, window, (before, after))


def _progress(figures: Figures) -> None:
    extra = f" ttft {figures.ttft_p50_ms:.2f} gap {figures.gap_ms:.4f}" if figures.gap_ms is not None else ""
    errors = f" ERRORS {figures.errors} {figures.error_kinds}" if figures.errors else ""
    print(
        f"  round {figures.round} {figures.scenario:<16} {figures.path:<8} {figures.requests:>5} req "
        f"{figures.rps:>8.0f}/s p50 {figures.p50_ms:.2f} p99 {figures.p99_ms:.2f} ms{extra}{errors}",
        file=sys.stderr,
        flush=True,
    )


async def each_window(
    rounds: int,
    scenarios: Sequence[Scenario],
    paths: Sequence[PathUnderTest],
    measure: Callable[[int, Scenario, PathUnderTest], Awaitable[T]],
    progress: Callable[[T], None],
) -> list[T]:
    """Alternating rounds: every scenario on every path in each round, so that noise lands on all alike."""
    results: list[T] = []
    for round_no in range(1, rounds + 1):
        for scenario in scenarios:
            for path in paths:
                if scenario.stream and not path.streams:
                    continue
                results.append(await measure(round_no, scenario, path))
                progress(results[-1])
    return results


async def run_rounds(
    rounds: int,
    scenarios: Sequence[Scenario],
    paths: Sequence[PathUnderTest],
    upstream: Service,
    limits: Limits,
) -> list[Figures]:
    async def one(round_no: int, scenario: Scenario, path: PathUnderTest) -> Figures:
        return await measure_window(round_no, scenario, path, upstream, limits)

    return await each_window(rounds, scenarios, paths, one, _progress)


def median_of(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None
