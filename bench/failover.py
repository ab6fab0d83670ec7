"""Mid-stream failover: how long a client waits when the backend fails in the middle of an answer.

    python -m bench.failover [--quick] [--failures 100] [--max-tokens 40] [--ttft-ms 20] [--tpot-ms 5]

One run starts two simulated backends (no jitter, known TTFT and TPOT) and a gateway with the
primary at priority 0 and the fallback at priority 1, both `continuation: vllm`. Every drill sends
a streamed request, the primary fails after k tokens, and the fallback continues the answer. The
kinds, interleaved and each with k spread over the answer:

  cut        the primary drops the connection (`cut_after=k`, set through PUT /sim/control/faults,
             since the gateway does not forward client headers upstream)
  kill       the benchmark SIGKILLs the primary the moment the client has k tokens, then restarts
             it on the same port
  stall      the primary stops sending (`stall_after=k`); the gateway's `stall_s` decides
  malformed  an invalid JSON chunk (`malformed_after=k`)
  inband     an error event inside the stream (`inband_error_after=k`)

Before each drill the same request runs uninterrupted (the baseline). Every drilled answer must
equal the uninterrupted one, character for character; the audit log must show that the primary
failed after output and the fallback finished. Then a few edge drills fail after the last token,
before the finish chunk (k = max_tokens), where the right continuation is no token at all.

It prints a Markdown table and the command, and writes every drill to bench/results/failover-<ts>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import uvloop

from bench.support.failover_calibrate import Calibration, calibrate
from bench.support.failover_fleet import SimTiming, fetch_audit, gateway_yaml, kill_now, port_of, reap, start_sim
from bench.support.failover_stats import (
    KILL,
    STALL,
    Drill,
    Failure,
    KindSummary,
    check_routing,
    fault_failure,
    kill_failure,
    markdown_summary,
    recovery_figures,
    summarize,
)
from bench.support.harness import (
    command_line,
    command_report_line,
    machine,
    machine_line,
    markdown,
    options_dict,
    run_benchmark,
)
from bench.support.harness import write_results as write_json
from bench.support.procs import Service, running
from bench.support.services import BENCH_DIR, REPO_DIR, issue_gateway_key, new_gateway_secret, serve_gateway
from bench.support.source_info import describe, source_info
from bench.support.sse_client import Hook, StreamRecord, stream_chat
from sim.text import generate_tokens

MODEL = "sim-model"
KINDS = ("cut", KILL, STALL, "malformed", "inband")
FAULT_FIELDS = {
    "cut": "cut_after",
    STALL: "stall_after",
    "malformed": "malformed_after",
    "inband": "inband_error_after",
}
EDGE_KINDS = ("cut", STALL, "malformed", "inband")


@dataclasses.dataclass(frozen=True)
class Options:
    failures: int
    max_tokens: int
    ttft_ms: float
    tpot_ms: float
    stall_s: float
    target_ms: float
    edge: bool
    seed: int
    out_dir: Path

    @property
    def timing(self) -> SimTiming:
        return SimTiming(self.ttft_ms, self.tpot_ms)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--quick", action="store_true", help="20 failures instead of 100")
    add("--failures", type=int, help="injected failures, spread evenly over the kinds (default 100, quick 20)")
    add("--max-tokens", type=int, default=40, help="tokens per answer (default 40)")
    add("--ttft-ms", type=float, default=20.0, help="both sims' time to first token (default 20)")
    add("--tpot-ms", type=float, default=5.0, help="both sims' time per output token (default 5)")
    add("--stall-s", type=float, default=0.2, help="the deployments' timeouts.stall_s (default 0.2)")
    add("--target-ms", type=float, default=50.0, help="the p99 recovery target (default 50)")
    add("--no-edge", action="store_true", help="skip the failures after the last token")
    add("--seed", type=int, default=1, help="orders the k values of each kind")
    add("--out-dir", type=Path, default=BENCH_DIR / "results", help="where the JSON goes")
    return parser


def parse_args(argv: list[str] | None = None) -> Options:
    parser = _parser()
    args = parser.parse_args(argv)
    failures = args.failures or (20 if args.quick else 100)
    if failures < 1 or args.max_tokens < 8:
        parser.error("--failures must be at least 1 and --max-tokens at least 8")
    return Options(
        failures=failures,
        max_tokens=args.max_tokens,
        ttft_ms=args.ttft_ms,
        tpot_ms=args.tpot_ms,
        stall_s=args.stall_s,
        target_ms=args.target_ms,
        edge=not args.no_edge,
        seed=args.seed,
        out_dir=args.out_dir,
    )


def k_values(max_tokens: int) -> list[int]:
    """Where the failure strikes: early, every 5 tokens, and just before the last token."""
    return sorted({1, 3, 5, *range(10, max_tokens, 5), max_tokens - 1})


def schedule(options: Options) -> list[tuple[str, int]]:
    """(kind, k) per drill: kinds interleaved, each kind going through shuffled copies of the k values."""
    rng = random.Random(options.seed)
    per_kind: dict[str, list[int]] = {}
    for kind in KINDS:
        ks: list[int] = []
        for _ in range(options.failures // len(KINDS) + 1):
            ks += rng.sample(k_values(options.max_tokens), len(k_values(options.max_tokens)))
        per_kind[kind] = ks
    return [(KINDS[i % len(KINDS)], per_kind[KINDS[i % len(KINDS)]][i // len(KINDS)]) for i in range(options.failures)]


@dataclasses.dataclass
class Fleet:
    workdir: Path
    options: Options
    primary: Service
    fallback: Service
    gateway: Service
    admin_key: str
    control: httpx.AsyncClient

    async def set_faults(self, **faults: Any) -> None:
        reply = await self.control.put(f"{self.primary.url}/sim/control/faults", json=faults)
        reply.raise_for_status()

    def restart_primary(self) -> None:
        reap(self.primary)
        self.primary = start_sim(self.workdir, "primary", self.options.timing, port_of(self.primary))


def messages_for(index: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Failover drill {index}: tell me something."}]


def body_for(messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    return {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "stream": True}


def expected_text(messages: list[dict[str, str]], max_tokens: int) -> str:
    """The uninterrupted answer: the sim's text is a pure function of the model and the messages."""
    return "".join(generate_tokens(MODEL, messages, max_tokens))


async def _inject(
    fleet: Fleet, client: httpx.AsyncClient, body: dict[str, Any], rid: str, kind: str, k: int
) -> StreamRecord:
    if kind == KILL:
        record = await stream_chat(client, body, rid, Hook(k, lambda: kill_now(fleet.primary)))
        await asyncio.to_thread(fleet.restart_primary)
        return record
    await fleet.set_faults(**{FAULT_FIELDS[kind]: k})
    try:
        return await stream_chat(client, body, rid)
    finally:
        await fleet.set_faults()


def _failure(kind: str, k: int, record: StreamRecord, options: Options) -> tuple[Failure | None, str]:
    if kind == KILL:
        return kill_failure(record, options.ttft_ms / 1000), "SIGKILL sent"
    if kind == STALL:
        return fault_failure(record, k, 0.0), "token k arrival (the stall clock starts there)"
    return fault_failure(record, k, options.tpot_ms / 1000), "token k arrival + 1 TPOT (estimate)"


def _ttft_ms(record: StreamRecord) -> float | None:
    return (record.token_times[0] - record.started) * 1000 if record.token_times else None


async def run_drill(fleet: Fleet, client: httpx.AsyncClient, index: int, kind: str, k: int) -> Drill:
    options = fleet.options
    messages = messages_for(index)
    body = body_for(messages, options.max_tokens)
    expected = expected_text(messages, options.max_tokens)
    baseline = await stream_chat(client, body, f"drill-{index}-baseline")
    record = await _inject(fleet, client, body, f"drill-{index}-{kind}-{k}", kind, k)
    failure, basis = _failure(kind, k, record, options)
    stall_s = options.stall_s if kind == STALL else None
    recovery = recovery_figures(failure, record, options.ttft_ms / 1000, stall_s)
    return Drill(
        index=index,
        kind=kind,
        k=k,
        request_id=record.request_id,
        failure_basis=basis,
        tokens=len(record.tokens),
        expected_tokens=options.max_tokens,
        text_matches=record.text == expected and record.done,
        baseline_text_matches=baseline.text == expected,
        errors=record.errors,
        finish_reason=record.finish_reason,
        late_primary_tokens=failure.late_primary_tokens if failure else 0,
        baseline_ttft_ms=_ttft_ms(baseline),
        baseline_request_id=baseline.request_id,
        gap_ms=recovery.gap_ms,
        recovery_ms=recovery.recovery_ms,
        recovery_minus_stall_ms=recovery.minus_stall_ms,
    )


def _progress(drill: Drill) -> None:
    figure = "-" if drill.recovery_ms is None else f"{drill.recovery_ms:7.2f} ms"
    flags = "" if drill.text_matches else f" TEXT MISMATCH ({drill.tokens}/{drill.expected_tokens} tokens)"
    flags += f" errors {drill.errors}" if drill.errors else ""
    print(f"  {drill.index:>3} {drill.kind:<9} k={drill.k:<3} recovery {figure}{flags}", file=sys.stderr, flush=True)


async def run_drills(fleet: Fleet, options: Options) -> tuple[list[Drill], list[Drill]]:
    headers = {"Authorization": f"Bearer {issue_gateway_key(fleet.gateway.url, fleet.admin_key)}"}
    async with httpx.AsyncClient(base_url=fleet.gateway.url, headers=headers, timeout=15) as client:
        await stream_chat(client, body_for(messages_for(-1), options.max_tokens), "warm-up")
        drills = []
        for index, (kind, k) in enumerate(schedule(options)):
            drills.append(await run_drill(fleet, client, index, kind, k))
            _progress(drills[-1])
        edge = []
        for offset, kind in enumerate(EDGE_KINDS if options.edge else ()):
            edge.append(await run_drill(fleet, client, options.failures + offset, kind, options.max_tokens))
            _progress(edge[-1])
    return drills, edge


@dataclasses.dataclass
class Outcome:
    drills: list[Drill]
    edge: list[Drill]
    calibration: Calibration
    load_at_start: float
    source: dict[str, Any]


async def _measure(fleet: Fleet, options: Options) -> tuple[list[Drill], list[Drill], Calibration]:
    body = body_for(messages_for(-2), options.max_tokens)
    calibration = await calibrate(fleet.workdir, fleet.fallback, options.timing, body)
    try:
        drills, edge = await run_drills(fleet, options)
    finally:
        await fleet.control.aclose()
    await asyncio.sleep(0.5)  # the audit writer flushes every 50 ms
    audit = await asyncio.to_thread(fetch_audit, fleet.gateway.url, fleet.admin_key)
    for drill in drills + edge:
        check_routing(drill, audit)
    return drills, edge, calibration


def measure(options: Options) -> Outcome:
    load_at_start = os.getloadavg()[0]
    source = source_info(REPO_DIR)
    with tempfile.TemporaryDirectory(prefix="failover-") as tmp, contextlib.ExitStack() as stack:
        workdir = Path(tmp)
        primary = stack.enter_context(running(start_sim(workdir, "primary", options.timing)))
        fallback = stack.enter_context(running(start_sim(workdir, "fallback", options.timing)))
        admin_key = new_gateway_secret()
        config = gateway_yaml(primary, fallback, options.stall_s, workdir / "gateway-data")
        gateway = stack.enter_context(running(serve_gateway(workdir, config, admin_key)))
        fleet = Fleet(workdir, options, primary, fallback, gateway, admin_key, httpx.AsyncClient(timeout=5))
        stack.callback(lambda: fleet.primary.stop())  # the primary of the moment: kills replace it
        drills, edge, calibration = uvloop.run(_measure(fleet, options))
    return Outcome(drills, edge, calibration, load_at_start, source)


def summaries(drills: list[Drill]) -> list[KindSummary]:
    return [summarize(kind, [d for d in drills if d.kind == kind]) for kind in KINDS] + [summarize("all", drills)]


MODULE = "bench.failover"


def _edge_cells(d: Drill) -> list[str]:
    attempts = ", ".join(f"{a['deployment']}:{a['error'] or 'ok'}" for a in d.attempts or [])
    match = "yes" if d.text_matches else "NO"
    return [d.kind, str(d.k), f"{d.tokens} / {d.expected_tokens}", match, str(d.finish_reason), attempts]


def markdown_edge(edge: list[Drill]) -> str:
    head = ["kind", "k", "tokens / expected", "text matches", "finish", "attempts"]
    return markdown(head, [_edge_cells(d) for d in edge])


def _median(values: list[float]) -> float | None:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else None


def _ms(values: list[float]) -> str:
    median = _median(values)
    return "-" if median is None else f"p50 {median:.1f} ms (max {max(values):.1f}, n={len(values)})"


def print_context(options: Options, outcome: Outcome) -> None:
    cal = outcome.calibration
    ttfts = [t for d in outcome.drills if (t := d.baseline_ttft_ms) is not None]
    print(
        f"\nWithout the gateway (calibration): the sim's TTFT as a client sees it {_ms(cal.direct_ttft_ms)} "
        f"(configured {options.ttft_ms:g} ms), token gap {_ms(cal.direct_gap_ms)}; SIGKILL to the end of a "
        f"direct connection {_ms(cal.kill_to_eof_ms)}: the OS, not the gateway, so the kill figure includes it."
    )
    detours = sum(d.baseline_attempts != [{"deployment": "primary", "error": None}] for d in outcome.drills)
    print(
        f"Uninterrupted baseline of every drill, through the gateway: TTFT {_ms(ttfts)}; "
        f"baselines not served by the primary alone: {detours}."
    )
    late = sum(d.late_primary_tokens for d in outcome.drills)
    print(f"Tokens of the primary that arrived after its SIGKILL (not counted as the fallback's first): {late}.")


def print_report(options: Options, outcome: Outcome, took_s: float) -> None:
    print(f"\n## Mid-stream failover recovery ({len(outcome.drills)} failures, {options.max_tokens}-token answers)\n")
    print(markdown_summary(summaries(outcome.drills), options.target_ms))
    stall_ms = options.stall_s * 1000
    print(
        f"\nRecovery = first token after the failure - failure time - the fallback's TTFT ({options.ttft_ms:g} ms). "
        f"Failure time: SIGKILL sent (kill); token k's arrival + 1 TPOT ({options.tpot_ms:g} ms), when token k+1 "
        f"was due (cut, malformed, inband: an estimate); token k's arrival (stall: where the gateway's stall "
        f"clock starts). Stall figures are minus the stall timeout ({stall_ms:g} ms), the raw column before it. "
        f"'all' uses the stall-adjusted figure."
    )
    print_context(options, outcome)
    if outcome.edge:
        print("\n### Failure after the last token, before the finish chunk (k = max_tokens)\n")
        print(markdown_edge(outcome.edge))
    print("\n" + machine_line(outcome.load_at_start))
    print(f"Code: {describe(outcome.source)} (when the run started).")
    print(command_report_line(MODULE, took_s))


def write_results(options: Options, outcome: Outcome, took_s: float) -> Path:
    document = {
        "command": command_line(MODULE),
        "took_s": took_s,
        "source": outcome.source,
        "machine": {**machine(), "load_average_1m_at_start": outcome.load_at_start},
        "options": options_dict(options),
        "summary": [dataclasses.asdict(s) for s in summaries(outcome.drills)],
        "drills": [dataclasses.asdict(d) for d in outcome.drills],
        "edge": [dataclasses.asdict(d) for d in outcome.edge],
        "calibration": dataclasses.asdict(outcome.calibration),
    }
    return write_json(options.out_dir, "failover", document)


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    started = time.monotonic()
    return run_benchmark(
        lambda: measure(options),
        lambda outcome, took_s: print_report(options, outcome, took_s),
        lambda outcome, took_s: write_results(options, outcome, took_s),
        started,
    )


if __name__ == "__main__":
    sys.exit(main())
