"""One replay from options to result document, usable without the CLI.

This is where the pieces meet: samples are loaded and prepared, the runner sends them, and the
records become a summary that is judged against the gates and against the tool's own lag.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Coroutine
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import httpx

from replay.client import ClientConfig, ClientPool, warm_up_stack
from replay.lag import judge_lag
from replay.metrics import Slo, summarize
from replay.report import result_document
from replay.runner import LoadPlan, Runner, arrival_offsets, order_for_plan
from replay.samples import Overrides, SampleSet, load_samples, prepare_all
from replay.slo import Gate, judge_gates

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class RunOptions:
    samples_path: Path
    client: ClientConfig
    plan: LoadPlan
    overrides: Overrides = field(default_factory=Overrides)
    slos: tuple[Slo, ...] = ()
    gates: tuple[Gate, ...] = ()
    max_lag_s: float = 0.005
    lag_ttft_fraction: float = 0.1
    show_progress: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # shown in the result's `run` section


def describe_shape(plan: LoadPlan) -> str:
    if plan.mode == "rate":
        shape = f"Poisson {plan.rate:g} req/s (seed {plan.seed}), at most {plan.concurrency} in flight"
    elif plan.mode == "original":
        shape = f"original timing x{plan.time_scale:g}, at most {plan.concurrency} in flight"
    else:
        shape = f"concurrency {plan.concurrency}"
    return f"{shape}; {plan.count} requests max, {plan.duration_s:g} s max"


def plan_for(plan: LoadPlan, samples: SampleSet) -> LoadPlan:
    """The plan with its count settled: a count of 0 means one pass over the samples, and
    original timing goes through the samples at most once."""
    available = len(samples.samples)
    if plan.count <= 0:
        return replace(plan, count=available)
    if plan.mode == "original":
        return replace(plan, count=min(plan.count, available))
    return plan


async def replay(options: RunOptions, transport: httpx.AsyncBaseTransport | None = None) -> dict[str, Any]:
    """Run the replay and return the result document (see `report.result_document`)."""
    samples = load_samples(options.samples_path)
    plan = plan_for(options.plan, samples)
    prepared = prepare_all(samples.samples, options.overrides)
    timestamps = [sample.timestamp for sample in samples.samples]
    order = order_for_plan(plan, timestamps)
    offsets = arrival_offsets(plan, [timestamps[i] for i in order])
    requests = [prepared[i] for i in order]
    await warm_up_stack()
    pool = ClientPool(options.client, plan.concurrency, transport)
    # A full collection walks every object of the process (tens of ms under pytest) and stalls the
    # loop mid-run; frozen objects are skipped, so collections only see what the run allocates.
    gc.collect()
    gc.freeze()
    try:
        runner = Runner(pool, options.client, plan, requests, offsets, options.show_progress)
        result = await runner.run()
    finally:
        gc.unfreeze()
        await pool.aclose()
    summary = summarize(result.records, result.wall_s, options.slos)
    lag = judge_lag(result.lag.lags_s, summary["latency"]["ttft"]["p50"], options.max_lag_s, options.lag_ttft_fraction)
    return result_document(
        run=_run_section(options, plan, samples, result.started_at, runner.counts.sent),
        records=result.records,
        summary=summary,
        lag=lag.to_json(),
        gates=judge_gates(options.gates, summary),
        problems=[] if lag.valid else [lag.reason],
    )


def _run_section(
    options: RunOptions, plan: LoadPlan, samples: SampleSet, started_at: float, dispatched: int
) -> dict[str, Any]:
    """What was run, against what, with which settings: the result file's `run` section."""
    client = options.client
    return {
        "samples": str(options.samples_path),
        "sample_formats": samples.formats,
        "skipped_lines": samples.skipped,
        "base_url": client.base_url,
        "shape": describe_shape(plan),
        "dispatched": dispatched,
        "plan": {name: getattr(plan, name) for name in plan.__dataclass_fields__},
        "overrides": {name: getattr(options.overrides, name) for name in options.overrides.__dataclass_fields__},
        "timeouts_s": {
            "connect": client.connect_timeout_s,
            "first_token": client.first_token_timeout_s,
            "stall": client.stall_timeout_s,
            "request": client.request_timeout_s,
        },
        "length_is_failure": client.length_is_failure,
        "started_at": started_at,
        **options.extra,
    }


def run_blocking(coro: Coroutine[Any, Any, _T], loop: str = "auto") -> _T:
    """Run `coro` on uvloop when available (less of the tool's own overhead in the timings)."""
    if loop in ("auto", "uvloop"):
        try:
            import uvloop
        except ImportError:
            if loop == "uvloop":
                raise
        else:
            result: _T = uvloop.run(coro)
            return result
    return asyncio.run(coro)
