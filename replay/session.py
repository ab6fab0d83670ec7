"""One replay from options to result document, usable without the CLI.

This is where the pieces meet: samples are loaded and prepared, the runner sends them, and the
records become a summary that is judged against the gates, the success-rate floor, and the tool's
own per-request delay (replay/lag.py).
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
from collections.abc import Coroutine
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import httpx
import orjson

from replay.client import ClientConfig, ClientPool, warm_up_stack
from replay.lag import DelayLimit, assess
from replay.metrics import Slo, summarize
from replay.report import result_document
from replay.runner import LoadPlan, Runner, arrival_offsets, order_for_plan
from replay.samples import Overrides, SampleSet, load_samples, prepare_all
from replay.slo import Gate, judge_gates

_T = TypeVar("_T")
# A run where most requests fail measured an error path, not the endpoint: exit non-zero by default.
DEFAULT_MIN_SUCCESS_RATE = 0.5
# More than this share of requests stopping at max_tokens earns a hint in the report.
LENGTH_HINT_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class RunOptions:
    samples_path: Path
    client: ClientConfig
    plan: LoadPlan
    overrides: Overrides = field(default_factory=Overrides)
    slos: tuple[Slo, ...] = ()
    gates: tuple[Gate, ...] = ()
    delay_limit: DelayLimit = field(default_factory=DelayLimit)
    # Past this share of requests excluded for the tool's own delay, the figures rest on too few.
    max_excluded_share: float = 0.5
    min_success_rate: float = DEFAULT_MIN_SUCCESS_RATE
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
    assess(result.records, result.lag, result.origin, options.delay_limit)
    summary = summarize(result.records, result.wall_s, options.slos)
    summary["hints"] = _hints(summary)
    gates = [*judge_gates(options.gates, summary), _success_floor(summary, options.min_success_rate)]
    return result_document(
        run=_run_section(options, plan, samples, result.started_at, runner.counts.sent),
        records=result.records,
        summary=summary,
        gates=gates,
        problems=_problems(summary, options),
        aborted=result.aborted,
    )


def _success_floor(summary: dict[str, Any], floor: float) -> dict[str, Any]:
    """The gate every run has: something succeeded, and at least `floor` of the requests did."""
    rate = summary["success_rate"]
    passed = summary["succeeded"] > 0 and rate is not None and rate >= floor
    return {"gate": f"success_rate>={floor:g} (floor, --min-success-rate)", "value": rate, "passed": passed}


def _problems(summary: dict[str, Any], options: RunOptions) -> list[str]:
    timing = summary["timing"]
    share = timing["excluded_share"]
    if share is None or share <= options.max_excluded_share:
        return []
    return [
        f"the tool's own delay exceeded {options.delay_limit.describe()} on {timing['excluded']} of "
        f"{timing['excluded'] + timing['measured']} requests (more than {options.max_excluded_share:.0%}): "
        "the latency figures rest on the rest only"
    ]


def _hints(summary: dict[str, Any]) -> list[str]:
    hints = []
    cutoffs, total = summary["length_cutoffs"], summary["requests"]
    if total and cutoffs > LENGTH_HINT_SHARE * total:
        hints.append(
            f"{cutoffs} of {total} requests stopped at their max_tokens (finish_reason length). Their latency "
            "is reported; to count them as successes pass --max-tokens N (cap the output on purpose) or --length-ok."
        )
    return hints


def workload_digest(samples_path: Path, settings: dict[str, Any]) -> dict[str, str]:
    """What `compare` checks to know two runs replayed the same workload the same way."""
    samples = hashlib.sha256(samples_path.read_bytes()).hexdigest()
    encoded = orjson.dumps(settings, option=orjson.OPT_SORT_KEYS)
    return {"samples_sha256": samples, "settings_sha256": hashlib.sha256(encoded).hexdigest()}


def _run_section(
    options: RunOptions, plan: LoadPlan, samples: SampleSet, started_at: float, dispatched: int
) -> dict[str, Any]:
    """What was run, against what, with which settings: the result file's `run` section."""
    client = options.client
    settings = {
        "plan": {name: getattr(plan, name) for name in plan.__dataclass_fields__},
        "overrides": {name: getattr(options.overrides, name) for name in options.overrides.__dataclass_fields__},
        "timeouts_s": {
            "connect": client.connect_timeout_s,
            "first_token": client.first_token_timeout_s,
            "stall": client.stall_timeout_s,
            "request": client.request_timeout_s,
        },
        "length_is_failure": client.length_is_failure,
    }
    return {
        "samples": str(options.samples_path),
        "sample_formats": samples.formats,
        "skipped_lines": samples.skipped,
        "base_url": client.base_url,
        "shape": describe_shape(plan),
        "dispatched": dispatched,
        **settings,
        "workload": workload_digest(options.samples_path, settings),
        "client_delay_limit": options.delay_limit.describe(),
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
