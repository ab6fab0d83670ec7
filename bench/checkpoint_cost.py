"""What session checkpoints cost a streaming gateway: throughput with sessions on vs off.

    python -m bench.checkpoint_cost [--quick] [--rounds 3] [--chunks 100] [--no-redis]

One run starts the fast upstream (bench/support/fast_upstream.py, N chunks written at once) and four
gateways: the embedded store and Redis, each with `sessions: {enabled: true}` (checkpoints every
16 events or 100 ms, the defaults) and `sessions: {enabled: false}`. Alternating rounds measure
every gateway at concurrency 1 and 16 with streams of 100 chunks, back to back, so that noise on
this shared machine lands on all of them alike. The figure of merit is throughput on / off per
store (median of the per-round ratios; target >= 0.9).

Redis runs under a fresh key prefix `bench-<random>-<variant>`, whose keys are deleted afterwards
with SCAN + DEL. It prints a Markdown table and the command, and writes the raw figures to
bench/results/checkpoint-cost-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvloop

from bench.support.checkpoint_report import Row, markdown_costs, markdown_throughput, row
from bench.support.checkpoint_rounds import Window, run_rounds
from bench.support.checkpoint_setup import (
    REDIS_URL,
    Variant,
    delete_redis_keys,
    redis_keys,
    redis_problem,
    session_count,
    start_variant,
)
from bench.support.harness import (
    command_line,
    command_report_line,
    machine,
    machine_line,
    mib,
    options_dict,
    run_benchmark,
)
from bench.support.harness import write_results as write_json
from bench.support.procs import Service, rss_bytes, running
from bench.support.runner import Limits, PathUnderTest, Scenario
from bench.support.services import BENCH_DIR, REPO_DIR, start_keyed_gateway, start_upstream
from bench.support.source_info import describe, source_info


@dataclasses.dataclass(frozen=True)
class Options:
    quick: bool
    rounds: int
    chunks: int
    concurrency: int
    requests_c1: int
    requests: int
    time_cap_s: float
    redis: bool
    out_dir: Path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--quick", action="store_true", help="short windows and 2 rounds: a smoke run")
    add("--rounds", type=int, help="rounds; the report takes medians (default 5, quick 2)")
    add("--chunks", type=int, default=100, help="content chunks per stream (default 100)")
    add("--concurrency", type=int, default=16, help="the high concurrency (default 16)")
    add("--requests-c1", type=int, help="requests per window at concurrency 1 (default 600, quick 100)")
    add("--requests", type=int, help="requests per window at the high concurrency (default 1500, quick 300)")
    add("--time-cap", type=float, help="seconds a measured window may run (default 8, quick 3)")
    add("--no-redis", action="store_true", help="measure the embedded store only")
    add("--out-dir", type=Path, default=BENCH_DIR / "results", help="where the JSON goes")
    return parser


def parse_args(argv: list[str] | None = None) -> Options:
    parser = _parser()
    args = parser.parse_args(argv)
    quick = bool(args.quick)
    options = Options(
        quick=quick,
        rounds=args.rounds or (2 if quick else 5),
        chunks=args.chunks,
        concurrency=args.concurrency,
        requests_c1=args.requests_c1 or (100 if quick else 600),
        requests=args.requests or (300 if quick else 1500),
        time_cap_s=args.time_cap or (3.0 if quick else 8.0),
        redis=not args.no_redis,
        out_dir=args.out_dir,
    )
    if min(options.rounds, options.chunks, options.concurrency, options.requests_c1, options.requests) < 1:
        parser.error("counts must be at least 1")
    return options


def scenarios(options: Options) -> list[Scenario]:
    return [
        Scenario("stream c=1", True, 1, options.requests_c1),
        Scenario(f"stream c={options.concurrency}", True, options.concurrency, options.requests),
    ]


def limits(options: Options) -> Limits:
    warmup = 20 if options.quick else 50
    return Limits(time_cap_s=options.time_cap_s, warmup_requests=warmup, warmup_cap_s=3.0, chunks=options.chunks)


def variants(redis_prefix: str | None) -> list[Variant]:
    stores = [("embedded", "")] + ([("redis", redis_prefix)] if redis_prefix else [])
    return [
        Variant(store, sessions, f"{prefix}-{'on' if sessions else 'off'}" if prefix else "")
        for store, prefix in stores
        for sessions in (True, False)
    ]


@contextlib.contextmanager
def redis_cleanup(prefix: str | None, report: dict[str, Any]) -> Iterator[None]:
    """Delete every key under `prefix-*` when the run ends, however it ends; count what was there."""
    try:
        yield
    finally:
        if prefix is not None:
            try:
                keys = redis_keys(prefix + "-*")
                report["keys_found"] = len(keys)
                report["keys_deleted"] = delete_redis_keys(keys)
                report["keys_left"] = len(redis_keys(prefix + "-*"))
            except (subprocess.SubprocessError, OSError) as exc:
                report["cleanup_failed"] = f"{exc!r}: delete the keys {prefix}-* by hand"
                print(f"Redis cleanup failed: {exc!r}; keys {prefix}-* remain", file=sys.stderr)


@dataclasses.dataclass
class Outcome:
    windows: list[Window]
    variants: list[Variant]
    sessions_written: dict[str, int]
    rss_bytes: dict[str, int]
    redis: dict[str, Any]
    load_at_start: float
    source: dict[str, Any]


def _start_paths(
    stack: contextlib.ExitStack, workdir: Path, upstream: Service, chosen: list[Variant]
) -> list[PathUnderTest]:
    paths = []
    for variant in chosen:
        gateway, key = start_keyed_gateway(stack, functools.partial(start_variant, workdir, variant, upstream.url))
        paths.append(PathUnderTest(variant.name, gateway.url, gateway, key))
    return paths


def measure(options: Options, redis_prefix: str | None, redis: dict[str, Any]) -> Outcome:
    load_at_start = os.getloadavg()[0]
    source = source_info(REPO_DIR)
    chosen = variants(redis_prefix)
    with (
        tempfile.TemporaryDirectory(prefix="checkpoint-cost-") as tmp,
        redis_cleanup(redis_prefix, redis),
        contextlib.ExitStack() as stack,
    ):
        workdir = Path(tmp)
        upstream = stack.enter_context(running(start_upstream(workdir, options.chunks)))
        paths = _start_paths(stack, workdir, upstream, chosen)
        counters = {v.name: functools.partial(session_count, workdir, v) for v in chosen if v.sessions}
        rounds = run_rounds(options.rounds, scenarios(options), paths, upstream, limits(options), counters)
        windows = uvloop.run(rounds)
        rss = {p.name: rss_bytes(p.proxy.pids()) for p in paths if p.proxy is not None}
        written = {v.name: session_count(workdir, v) for v in chosen}
    return Outcome(windows, chosen, written, rss, redis, load_at_start, source)


def table(options: Options, outcome: Outcome) -> list[Row]:
    stores = list(dict.fromkeys(v.store for v in outcome.variants))
    return [row(outcome.windows, store, s.name, options.chunks) for store in stores for s in scenarios(options)]


MODULE = "bench.checkpoint_cost"


def print_report(options: Options, outcome: Outcome, took_s: float) -> None:
    print(f"\n## Session checkpoint cost (median of {options.rounds} rounds, {options.chunks}-chunk streams)\n")
    rows = table(options, outcome)
    print(markdown_throughput(rows))
    print(
        "\nSustained req/s counts the drain: after each window the gateway's CPU is watched until it idles, "
        "since checkpoints are written off the request path and may finish after the last response.\n"
    )
    print(markdown_costs(rows))
    print("\nSessions checkpointed per gateway: " + ", ".join(f"{k} {v}" for k, v in outcome.sessions_written.items()))
    print("RSS at the end: " + ", ".join(f"{k} {mib(v)}" for k, v in outcome.rss_bytes.items()))
    if outcome.redis:
        print(f"Redis ({REDIS_URL}): " + ", ".join(f"{k} {v}" for k, v in outcome.redis.items()))
    print(machine_line(outcome.load_at_start))
    print(f"Code: {describe(outcome.source)} (when the run started).")
    print(command_report_line(MODULE, took_s))


def write_results(options: Options, outcome: Outcome, took_s: float) -> Path:
    document = {
        "command": command_line(MODULE),
        "took_s": took_s,
        "source": outcome.source,
        "machine": {**machine(), "load_average_1m_at_start": outcome.load_at_start},
        "options": options_dict(options),
        "variants": [dataclasses.asdict(v) for v in outcome.variants],
        "summary": [dataclasses.asdict(r) for r in table(options, outcome)],
        "sessions_written": outcome.sessions_written,
        "rss_bytes": outcome.rss_bytes,
        "redis": outcome.redis,
        "windows": [
            {
                **dataclasses.asdict(w),
                "sustained_rps": w.sustained_rps,
                "cpu_ms_with_drain": w.cpu_ms_per_req_with_drain,
            }
            for w in outcome.windows
        ],
    }
    return write_json(options.out_dir, "checkpoint-cost", document)


def _redis_prefix(options: Options, redis: dict[str, Any]) -> str | None:
    if not options.redis:
        redis["skipped"] = "--no-redis"
        return None
    problem = redis_problem()
    if problem:
        print(f"Redis not measured: {problem}", file=sys.stderr)
        redis["skipped"] = problem
        return None
    prefix = "bench-" + secrets.token_hex(6)
    redis["key_prefix"] = prefix + "-{on,off}"
    return prefix


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    started = time.monotonic()
    redis: dict[str, Any] = {}
    return run_benchmark(
        lambda: measure(options, _redis_prefix(options, redis), redis),
        lambda outcome, took_s: print_report(options, outcome, took_s),
        lambda outcome, took_s: write_results(options, outcome, took_s),
        started,
    )


if __name__ == "__main__":
    sys.exit(main())
