"""`gateway serve --workers 1` vs `--workers 2` on the redis store (which several workers need):
non-streaming throughput and CPU at high concurrency, both gateways running, alternating windows,
median of the rounds.

    python -m bench.workers [--rounds 3] [--requests 3000] [--concurrency 64]

Keys go under a fresh prefix on the Redis at 127.0.0.1:6379 (reached with redis-cli to clean up) and are
deleted at the end. The load generator, the upstream and the workers share this machine's cores,
so the ratio is bounded by the cores left for the workers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import statistics
import tempfile
import uuid
from pathlib import Path

from bench.support.checkpoint_setup import REDIS_URL, delete_redis_keys, redis_keys
from bench.support.harness import machine_line
from bench.support.procs import Service, running
from bench.support.runner import Figures, Limits, PathUnderTest, Scenario, measure_window
from bench.support.services import gateway_config, serve_gateway, start_keyed_gateway, start_upstream


def _rounds(paths: list[PathUnderTest], upstream: Service, options: argparse.Namespace) -> dict[str, list[Figures]]:
    scenario = Scenario(f"non-stream c={options.concurrency}", False, options.concurrency, options.requests)
    limits = Limits(time_cap_s=30, warmup_requests=300, warmup_cap_s=10, chunks=20)
    results: dict[str, list[Figures]] = {path.name: [] for path in paths}
    for round_no in range(1, options.rounds + 1):
        for path in paths if round_no % 2 else paths[::-1]:
            figures = asyncio.run(measure_window(round_no, scenario, path, upstream, limits))
            cpu = figures.proxy_cpu_ms_per_req or 0.0
            print(f"  round {round_no} {path.name}: {figures.rps:.0f} req/s, CPU {cpu:.2f} ms/req", flush=True)
            results[path.name].append(figures)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=64)
    options = parser.parse_args()
    prefix = f"agw-bench-{uuid.uuid4().hex[:12]}"
    load = os.getloadavg()[0]
    try:
        with tempfile.TemporaryDirectory(prefix="agw-workers-") as scratch, contextlib.ExitStack() as stack:
            workdir = Path(scratch)
            upstream = stack.enter_context(running(start_upstream(workdir, 20)))
            store = f"{{kind: redis, url: '{REDIS_URL}', key_prefix: {prefix}}}"
            config = gateway_config(upstream.url, workdir, store=store)
            paths = []
            for workers in (1, 2):
                name = f"workers={workers}"
                args = ("--workers", str(workers))
                start = functools.partial(serve_gateway, workdir, config, name=name, stem=name, extra_args=args)
                gateway, key = start_keyed_gateway(stack, start)
                paths.append(PathUnderTest(name, gateway.url, gateway, key))
            results = _rounds(paths, upstream, options)
    finally:
        delete_redis_keys(redis_keys(f"{prefix}:*"))
    rps = {name: statistics.median(f.rps for f in figures) for name, figures in results.items()}
    cpu = {name: statistics.median(f.proxy_cpu_ms_per_req or 0 for f in figures) for name, figures in results.items()}
    print("\n| workers | req/s | p50 ms | p99 ms | CPU ms/req (all workers) |\n|---|---|---|---|---|")
    for name, figures in results.items():
        p50 = statistics.median(f.p50_ms for f in figures)
        p99 = statistics.median(f.p99_ms for f in figures)
        print(f"| {name.split('=')[1]} | {rps[name]:,.0f} | {p50:.1f} | {p99:.1f} | {cpu[name]:.2f} |")
    print(f"\n2 workers / 1 worker: {rps['workers=2'] / rps['workers=1']:.2f}x req/s")
    print(machine_line(load))


if __name__ == "__main__":
    main()
