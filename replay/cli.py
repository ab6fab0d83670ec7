"""The `replay run` and `replay compare` commands; `gateway/cli/replay.py` groups them.

Exit codes of `run`: 0 all gates passed and the figures are trustworthy; 1 a gate failed, which
includes the success-rate floor every run has (nothing succeeded, or less than --min-success-rate);
3 the tool's own delay distorted more than half of the requests, so the latency figures rest on too
few (unless --allow-lag; requests it distorted are always left out and counted). `compare` exits 1
on a significant regression beyond the threshold and 2 when the two runs did not replay the same
workload (unless --allow-different-workload). Usage errors exit 2, as click does.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from replay.client import ClientConfig
from replay.compare import compare_results, render_comparison, workload_mismatch
from replay.html import write_html
from replay.lag import DEFAULT_FRACTION, DelayLimit
from replay.report import ResultError, load_result, render_per_request, render_summary, write_result
from replay.runner import LoadPlan
from replay.samples import Overrides, PrepareError, SampleError
from replay.session import DEFAULT_MIN_SUCCESS_RATE, RunOptions, replay, run_blocking
from replay.slo import SpecError, parse_gate, parse_slo

EXIT_GATE_FAILED = 1
EXIT_INVALID = 3
EXIT_REGRESSION = 1
EXIT_DIFFERENT_WORKLOAD = 2
# Requests sent at most when only --duration bounds the run: still a bound on the count.
MAX_COUNT_FOR_DURATION = 1_000_000
DEFAULT_OPEN_LOOP_CAP = 512


def _headers(values: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    pairs = []
    for value in values:
        name, sep, content = value.partition(":")
        if not sep or not name.strip():
            raise click.BadParameter(f"{value!r}: expected 'Name: value'", param_hint="--header")
        pairs.append((name.strip(), content.strip()))
    return tuple(pairs)


def _plan(
    concurrency: int | None,
    rate: float | None,
    original: bool,
    time_scale: float,
    count: int | None,
    duration: float | None,
    drain: float,
    seed: int,
) -> LoadPlan:
    if rate is not None and original:
        raise click.UsageError("--rate and --original-timing are different load shapes; pick one")
    mode = "rate" if rate is not None else "original" if original else "concurrency"
    default_width = 1 if mode == "concurrency" else DEFAULT_OPEN_LOOP_CAP
    if count is None:
        count = MAX_COUNT_FOR_DURATION if duration is not None else 0
    return LoadPlan(
        mode=mode,
        concurrency=concurrency or default_width,
        count=count,
        duration_s=duration if duration is not None else 600.0,
        drain_s=drain,
        rate=rate,
        time_scale=time_scale,
        seed=seed,
    )


def _exit_code(document: dict[str, object], allow_lag: bool) -> int:
    gates = document["gates"]
    assert isinstance(gates, list)
    if any(not gate["passed"] for gate in gates):
        return EXIT_GATE_FAILED
    if not document["valid"] and not allow_lag:
        return EXIT_INVALID
    return 0


@click.command("run")
@click.argument("samples", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--base-url",
    envvar=["REPLAY_BASE_URL", "OPENAI_BASE_URL"],
    required=True,
    help="Endpoint root, e.g. http://127.0.0.1:8080/v1 (env REPLAY_BASE_URL).",
)
@click.option(
    "--api-key",
    envvar=["REPLAY_API_KEY", "OPENAI_API_KEY"],
    default=None,
    help="Bearer token (env REPLAY_API_KEY, then OPENAI_API_KEY).",
)
@click.option("--header", "headers", multiple=True, help="Extra request header 'Name: value' (repeatable).")
@click.option("--model", default=None, help="Override every sample's model.")
@click.option(
    "--max-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="Override max_tokens (then finish_reason length is expected, not a failure).",
)
@click.option("--stream/--no-stream", default=None, help="Override streaming (default: as in each sample).")
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=None,
    help="Closed loop of N workers; with --rate/--original-timing, the in-flight cap (default 512).",
)
@click.option(
    "--rate",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Open loop: Poisson arrivals at R requests/s.",
)
@click.option("--original-timing", is_flag=True, help="Open loop at the samples' own timestamps.")
@click.option(
    "--time-scale",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    help="Multiplier on the original gaps: 0.5 replays twice as fast.",
)
@click.option(
    "--count",
    type=click.IntRange(min=1),
    default=None,
    help="Requests to send (samples repeat in order) [default: one pass; 1,000,000 with --duration].",
)
@click.option(
    "--duration",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Stop dispatching after S seconds [default: 600].",
)
@click.option(
    "--drain-timeout",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="Seconds in-flight requests may take after dispatching stops; then they are cancelled.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the Poisson arrivals.")
@click.option(
    "--connect-timeout", type=float, default=5.0, show_default=True, help="Seconds to connect and to write the request."
)
@click.option(
    "--first-token-timeout",
    type=float,
    default=60.0,
    show_default=True,
    help="Seconds from dispatch to the first output chunk (streams).",
)
@click.option(
    "--stall-timeout",
    type=float,
    default=30.0,
    show_default=True,
    help="Seconds without bytes after the first output chunk.",
)
@click.option("--request-timeout", type=float, default=600.0, show_default=True, help="Overall bound per request.")
@click.option("--length-ok", is_flag=True, help="Report unexpected finish_reason length, but not as a failure.")
@click.option("--slo", "slos", multiple=True, help="Per-request SLO for goodput, e.g. ttft=800ms, tpot=60ms, e2e=10s.")
@click.option("--min-goodput", type=click.FloatRange(0, 1), default=None, help="Gate: goodput under --slo >= X.")
@click.option("--gate", "gates", multiple=True, help="Gate on the summary, e.g. success_rate>=0.99, ttft_p99<=1s.")
@click.option(
    "--min-success-rate",
    type=click.FloatRange(0, 1),
    default=DEFAULT_MIN_SUCCESS_RATE,
    show_default=True,
    help="Floor every run is gated on; a run where nothing succeeded always fails.",
)
@click.option(
    "--max-lag",
    "max_lag_ms",
    type=click.FloatRange(min=0),
    default=2.0,
    show_default=True,
    help="Per-request client delay limit in ms (or 3% of the request's TTFT, if larger); "
    "requests beyond it are left out of the latency figures and counted.",
)
@click.option(
    "--allow-lag", is_flag=True, help="Exit 0 even when client delay distorted more than half of the requests."
)
@click.option("--per-request", is_flag=True, help="Also print one line per request.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="JSON result file.")
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Self-contained HTML report.",
)
@click.option("--quiet", is_flag=True, help="No live progress line.")
@click.option("--loop", type=click.Choice(["auto", "asyncio", "uvloop"]), default="auto", show_default=True)
def run_command(
    samples: Path,
    base_url: str,
    api_key: str | None,
    headers: tuple[str, ...],
    model: str | None,
    max_tokens: int | None,
    stream: bool | None,
    concurrency: int | None,
    rate: float | None,
    original_timing: bool,
    time_scale: float,
    count: int | None,
    duration: float | None,
    drain_timeout: float,
    seed: int,
    connect_timeout: float,
    first_token_timeout: float,
    stall_timeout: float,
    request_timeout: float,
    length_ok: bool,
    slos: tuple[str, ...],
    min_goodput: float | None,
    gates: tuple[str, ...],
    min_success_rate: float,
    max_lag_ms: float,
    allow_lag: bool,
    per_request: bool,
    out: Path | None,
    html_path: Path | None,
    quiet: bool,
    loop: str,
) -> None:
    """Replay SAMPLES against an OpenAI-compatible endpoint and measure it."""
    try:
        parsed_slos = tuple(parse_slo(text) for text in slos)
        parsed_gates = [parse_gate(text) for text in gates]
        if min_goodput is not None:
            parsed_gates.append(parse_gate(f"goodput>={min_goodput}"))
    except SpecError as exc:
        raise click.UsageError(str(exc)) from exc
    if any(gate.name == "goodput" for gate in parsed_gates) and not parsed_slos:
        raise click.UsageError("a goodput gate needs at least one --slo")
    client = ClientConfig(
        base_url=base_url,
        api_key=api_key,
        headers=_headers(headers),
        connect_timeout_s=connect_timeout,
        first_token_timeout_s=first_token_timeout,
        stall_timeout_s=stall_timeout,
        request_timeout_s=request_timeout,
        length_is_failure=not length_ok,
    )
    options = RunOptions(
        samples_path=samples,
        client=client,
        plan=_plan(concurrency, rate, original_timing, time_scale, count, duration, drain_timeout, seed),
        overrides=Overrides(model=model, max_tokens=max_tokens, stream=stream),
        slos=parsed_slos,
        gates=tuple(parsed_gates),
        delay_limit=DelayLimit(max_lag_ms / 1000, DEFAULT_FRACTION),
        min_success_rate=min_success_rate,
        show_progress=not quiet,
    )
    try:
        document = run_blocking(replay(options), loop)
    except (SampleError, PrepareError, ValueError) as exc:
        raise click.UsageError(str(exc)) from exc
    if per_request:
        click.echo(render_per_request(document))
    click.echo(render_summary(document))
    if out is not None:
        write_result(out, document)
        click.echo(f"result: {out}", err=True)
    if html_path is not None:
        write_html(html_path, document)
        click.echo(f"html report: {html_path}", err=True)
    sys.exit(_exit_code(document, allow_lag))


@click.command("compare")
@click.argument("base", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("candidate", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--threshold",
    type=click.FloatRange(min=0),
    default=0.1,
    show_default=True,
    help="Relative change of a latency median that counts as a regression (0.1 = 10%).",
)
@click.option(
    "--rate-threshold",
    type=click.FloatRange(min=0),
    default=0.01,
    show_default=True,
    help="Absolute drop of success rate or goodput that counts as a regression.",
)
@click.option("--resamples", type=click.IntRange(100, 100_000), default=2000, show_default=True)
@click.option("--confidence", type=click.FloatRange(0.5, 0.999), default=0.95, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the bootstrap.")
@click.option(
    "--allow-different-workload",
    is_flag=True,
    help="Compare even when the runs replayed different samples or settings (warned, not refused).",
)
def compare_command(
    base: Path,
    candidate: Path,
    threshold: float,
    rate_threshold: float,
    resamples: int,
    confidence: float,
    seed: int,
    allow_different_workload: bool,
) -> None:
    """Compare two result files; exit 1 on a significant regression beyond the threshold."""
    try:
        base_doc, candidate_doc = load_result(base), load_result(candidate)
    except ResultError as exc:
        raise click.UsageError(str(exc)) from exc
    mismatch = workload_mismatch(base_doc, candidate_doc)
    if mismatch is not None:
        if not allow_different_workload:
            click.echo(f"refusing to compare: {mismatch} (--allow-different-workload to compare anyway)", err=True)
            sys.exit(EXIT_DIFFERENT_WORKLOAD)
        click.echo(f"WARNING: {mismatch}; the comparison below may show the workload, not the endpoint", err=True)
    verdicts = compare_results(
        base_doc,
        candidate_doc,
        threshold=threshold,
        rate_threshold=rate_threshold,
        resamples=resamples,
        confidence=confidence,
        seed=seed,
    )
    click.echo(render_comparison(verdicts, base_doc, candidate_doc, (str(base), str(candidate))))
    sys.exit(EXIT_REGRESSION if any(v.regression for v in verdicts) else 0)
