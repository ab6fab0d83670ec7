"""What a proxy adds: direct to a fast upstream vs this gateway vs the LiteLLM proxy vs Portkey's gateway.

    python -m bench.overhead [--quick] [--rounds 3] [--litellm-python PATH] [--portkey-dir DIR]

One run starts the upstream (bench/support/fast_upstream.py), the gateway and, when available, LiteLLM and
Portkey, then measures in alternating rounds every scenario (non-streaming and streaming, at
concurrency 1 and 32) on every path. Portkey 1.15.2 answers every stream here with a 500
("TypeError: immutable" in its updateHeaders, on Node 20 and 22), so it runs the non-streaming
scenarios only. It prints a Markdown table, the targets and the command, writes the raw figures to
bench/results/overhead-<timestamp>.json, and exits 2 when a target is missed.

Portkey's gateway is installed with npm inside the checkout (or set AGW_PORTKEY_DIR):
    npm install --prefix bench/.portkey @portkey-ai/gateway@1.15.2

LiteLLM runs from its own virtualenv, so that its large dependency tree never changes the main
environment (inside the checkout, gitignored; or set AGW_LITELLM_PYTHON to another interpreter):
    python -m venv bench/.venv-litellm && bench/.venv-litellm/bin/pip install "litellm[proxy]==1.108.7"
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path

import uvloop

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
from bench.support.overhead_report import markdown_floor, markdown_ratios, markdown_table, missed, ratios, rows
from bench.support.procs import Service, rss_bytes, running
from bench.support.runner import Figures, Limits, PathUnderTest, Scenario, run_rounds
from bench.support.services import (
    BENCH_DIR,
    DEFAULT_LITELLM_PYTHON,
    DEFAULT_PORTKEY_DIR,
    REPO_DIR,
    LiteLLMCheck,
    PortkeyCheck,
    check_litellm,
    check_portkey,
    portkey_headers,
    start_floor,
    start_gateway,
    start_keyed_gateway,
    start_litellm,
    start_portkey,
    start_upstream,
)
from common.processes import ProcessStartError


@dataclasses.dataclass(frozen=True)
class Options:
    quick: bool
    rounds: int
    requests: int  # per window at high concurrency
    requests_c1: int
    concurrency: int
    time_cap_s: float
    chunks: int
    litellm_python: Path | None
    no_litellm: bool
    portkey_dir: Path
    no_portkey: bool
    out_dir: Path
    gateway_dir: Path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--quick", action="store_true", help="small counts: a smoke run of well under a minute")
    add("--rounds", type=int, help="rounds; the report takes the median (default 3, quick 2)")
    add("--requests", type=int, help="requests per window at high concurrency (default 2000)")
    add("--requests-c1", type=int, help="requests per window at concurrency 1 (default 500)")
    add("--concurrency", type=int, default=32, help="the high concurrency (default 32)")
    add("--time-cap", type=float, help="seconds a measured window may run (default 20, quick 4)")
    add("--chunks", type=int, default=20, help="content chunks per stream (default 20)")
    default_python = DEFAULT_LITELLM_PYTHON if DEFAULT_LITELLM_PYTHON.exists() else None
    add("--litellm-python", type=Path, default=default_python, help=f"default {DEFAULT_LITELLM_PYTHON}")
    add("--no-litellm", action="store_true", help="do not measure LiteLLM")
    add("--portkey-dir", type=Path, default=DEFAULT_PORTKEY_DIR, help=f"default {DEFAULT_PORTKEY_DIR}")
    add("--no-portkey", action="store_true", help="do not measure Portkey")
    add("--out-dir", type=Path, default=BENCH_DIR / "results", help="where the JSON goes")
    add("--gateway-dir", type=Path, default=REPO_DIR, help="run the gateway package found here (A/B a change)")
    return parser


def parse_args(argv: list[str] | None = None) -> Options:
    parser = _parser()
    args = parser.parse_args(argv)
    quick = bool(args.quick)
    options = Options(
        quick=quick,
        rounds=args.rounds or (2 if quick else 3),
        requests=args.requests or (400 if quick else 2000),
        requests_c1=args.requests_c1 or (100 if quick else 500),
        concurrency=args.concurrency,
        time_cap_s=args.time_cap or (4.0 if quick else 20.0),
        chunks=args.chunks,
        litellm_python=args.litellm_python,
        no_litellm=bool(args.no_litellm),
        portkey_dir=args.portkey_dir,
        no_portkey=bool(args.no_portkey),
        out_dir=args.out_dir,
        gateway_dir=args.gateway_dir.resolve(),
    )
    if min(options.rounds, options.requests, options.requests_c1, options.concurrency, options.chunks) < 1:
        parser.error("counts must be at least 1")
    return options


def scenarios(options: Options) -> list[Scenario]:
    result = []
    for stream in (False, True):
        for concurrency in (1, options.concurrency):
            requests = options.requests_c1 if concurrency == 1 else options.requests
            name = f"{'stream' if stream else 'non-stream'} c={concurrency}"
            result.append(Scenario(name, stream, concurrency, requests))
    return result


def limits(options: Options) -> Limits:
    warmup = 20 if options.quick else 100
    return Limits(time_cap_s=options.time_cap_s, warmup_requests=warmup, warmup_cap_s=3.0, chunks=options.chunks)


def _start_litellm_or_none(
    workdir: Path, check: LiteLLMCheck, upstream: Service, master_key: str
) -> tuple[Service | None, str]:
    if check.python is None:
        return None, check.reason
    print(f"starting LiteLLM {check.version} from {check.python} ...", file=sys.stderr, flush=True)
    try:
        return start_litellm(workdir, check.python, upstream.url, master_key), ""
    except ProcessStartError as exc:
        return None, f"LiteLLM did not start: {exc}"


MODULE = "bench.overhead"


@dataclasses.dataclass
class Outcome:
    figures: list[Figures]
    paths: list[str]
    rss_bytes: dict[str, int]
    litellm_reason: str
    portkey_reason: str
    load_at_start: float  # 1-minute load average: a busy machine shows in the figures


@dataclasses.dataclass(frozen=True)
class Peers:
    litellm: LiteLLMCheck
    portkey: PortkeyCheck


def _portkey_path(
    stack: contextlib.ExitStack, workdir: Path, check: PortkeyCheck, upstream: Service
) -> PathUnderTest | str:
    if check.server is None:
        return check.reason
    print(f"starting Portkey {check.version} from {check.server} ...", file=sys.stderr, flush=True)
    try:
        portkey = stack.enter_context(running(start_portkey(workdir, check.server)))
    except ProcessStartError as exc:
        return f"Portkey did not start: {exc}"
    return PathUnderTest("portkey", portkey.url, portkey, headers=portkey_headers(upstream.url), streams=False)


def measure(options: Options, peers: Peers) -> Outcome:
    load_at_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="overhead-") as tmp, contextlib.ExitStack() as stack:
        workdir = Path(tmp)
        upstream = stack.enter_context(running(start_upstream(workdir, options.chunks)))
        gateway, gateway_key = start_keyed_gateway(
            stack, lambda admin_key: start_gateway(workdir, upstream.url, options.gateway_dir, admin_key)
        )
        floor = stack.enter_context(running(start_floor(workdir, upstream.url)))
        paths = [
            PathUnderTest("direct", upstream.url, None),
            PathUnderTest("floor", floor.url, floor),
            PathUnderTest("gateway", gateway.url, gateway, gateway_key),
            # The same gateway on the Responses API: what translating at the edge costs.
            PathUnderTest("gateway-responses", gateway.url, gateway, gateway_key, api="responses"),
            # ... with store: false: the translation alone, without keeping each response.
            PathUnderTest("gateway-responses-unkept", gateway.url, gateway, gateway_key, api="responses-unkept"),
            PathUnderTest("gateway-messages", gateway.url, gateway, gateway_key, api="messages"),
        ]
        master_key = "sk-bench-" + secrets.token_hex(16)
        litellm, reason = _start_litellm_or_none(workdir, peers.litellm, upstream, master_key)
        if litellm is not None:
            stack.enter_context(running(litellm))
            paths.append(PathUnderTest("litellm", litellm.url, litellm, master_key))
        else:
            print(f"LiteLLM not measured: {reason}", file=sys.stderr, flush=True)
        portkey = _portkey_path(stack, workdir, peers.portkey, upstream)
        portkey_reason = portkey if isinstance(portkey, str) else ""
        if isinstance(portkey, PathUnderTest):
            paths.append(portkey)
        else:
            print(f"Portkey not measured: {portkey}", file=sys.stderr, flush=True)
        figures = uvloop.run(run_rounds(options.rounds, scenarios(options), paths, upstream, limits(options)))
        rss = {p.name: rss_bytes(p.proxy.pids()) for p in paths if p.proxy is not None}
    return Outcome(figures, [p.name for p in paths], rss, reason, portkey_reason, load_at_start)


def print_report(options: Options, outcome: Outcome, peers: Peers, took_s: float) -> None:
    table = rows(outcome.figures, scenarios(options), outcome.paths)
    print(f"\n## Proxy overhead (median of {options.rounds} rounds, {options.chunks}-chunk streams)\n")
    print(markdown_table(table))
    print("\nRSS at the end: " + ", ".join(f"{k} {mib(v)}" for k, v in outcome.rss_bytes.items()))
    print("\n" + markdown_ratios(ratios(table, scenarios(options))))
    print("\nAbove the floor (the gateway's server and upstream client with nothing between them):\n")
    print(markdown_floor(table, scenarios(options)))
    if outcome.litellm_reason:
        print(f"\nLiteLLM was not measured: {outcome.litellm_reason}")
    else:
        print(
            f"\nLiteLLM {peers.litellm.version} (proxy, 1 worker, master key, no database, telemetry and "
            "spend logs off)."
        )
    if outcome.portkey_reason:
        print(f"Portkey was not measured: {outcome.portkey_reason}")
    else:
        print(f"Portkey {peers.portkey.version} (Node, headless, no auth): non-streaming only, its streams fail here.")
    print(machine_line(outcome.load_at_start))
    print(command_report_line(MODULE, took_s))


def write_results(options: Options, outcome: Outcome, peers: Peers, took_s: float) -> Path:
    table = rows(outcome.figures, scenarios(options), outcome.paths)
    document = {
        "command": command_line(MODULE),
        "took_s": took_s,
        "machine": {**machine(with_platform=True), "load_average_1m_at_start": outcome.load_at_start},
        "options": options_dict(options),
        "litellm": {"version": peers.litellm.version, "not_measured": outcome.litellm_reason or None},
        "portkey": {"version": peers.portkey.version, "not_measured": outcome.portkey_reason or None},
        "scenarios": [dataclasses.asdict(s) for s in scenarios(options)],
        "summary": [dataclasses.asdict(r) for r in table],
        "ratios": [dataclasses.asdict(r) for r in ratios(table, scenarios(options))],
        "rss_bytes": outcome.rss_bytes,
        "windows": [dataclasses.asdict(f) for f in outcome.figures],
    }
    return write_json(options.out_dir, "overhead", document)


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    started = time.monotonic()
    peers = Peers(
        check_litellm(options.litellm_python, options.no_litellm),
        check_portkey(options.portkey_dir, options.no_portkey),
    )
    return run_benchmark(
        lambda: measure(options, peers),
        lambda outcome, took_s: print_report(options, outcome, peers, took_s),
        lambda outcome, took_s: write_results(options, outcome, peers, took_s),
        started,
        lambda outcome: _verdict(options, outcome),
    )


def _verdict(options: Options, outcome: Outcome) -> int:
    table = rows(outcome.figures, scenarios(options), outcome.paths)
    misses = missed(ratios(table, scenarios(options)))
    for miss in misses:
        print(f"TARGET MISSED: {miss.name} = {miss.value:.3f} (goal {miss.target})", file=sys.stderr)
    return 2 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
