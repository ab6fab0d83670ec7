"""The `evals run`, `evals show` and `evals compare` commands; `gateway/cli/evals.py` groups them.

Exit codes of `run`: 0 the gate passed; 1 the gate failed; 2 usage errors, including a set file that
does not load (as click does for bad parameters). Of `compare`: 0 no regression; 1 B scored lower
than A; 2 usage errors, including results of different sets (digests).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import click
import orjson

from eval.compare import Comparison, DigestMismatch, ResultFileError, compare_results, load_result
from eval.gate import GateVerdict, Thresholds, check_gate
from eval.runner import CaseResult, EvalResult, run_eval
from eval.sets import EvalSet, EvalSetError, load_eval_set

EXIT_GATE_FAILED = 1
EXIT_REGRESSED = 1
_DETAIL_CHARS = 100

_set_argument = click.argument("set_path", metavar="SET", type=click.Path(dir_okay=False, path_type=Path))


def _load(path: Path) -> EvalSet:
    try:
        return load_eval_set(path)
    except EvalSetError as error:
        raise click.BadParameter("\n  ".join(["does not load:", *error.problems]), param_hint="SET") from error


def _tag_thresholds(values: tuple[str, ...]) -> dict[str, float]:
    thresholds = {}
    for value in values:
        tag, sep, rate = value.partition("=")
        try:
            thresholds[tag.strip()] = float(rate)
        except ValueError:
            sep = ""
        if not sep or not tag.strip():
            raise click.BadParameter(f"{value!r}: expected TAG=RATE", param_hint="--tag-min-pass-rate")
    return thresholds


def _case_line(case: CaseResult) -> str:
    status = "ERROR" if case.error else "PASS" if case.passed else "FAIL"
    latency = f"{case.latency_s * 1000:8.0f}" if case.latency_s is not None else "       -"
    detail = case.error or "; ".join(f"#{f.index} {f.kind}: {f.message}" for f in case.failures)
    return f"{case.case_id:<28} {status:<6} {latency}  {detail[:_DETAIL_CHARS]}".rstrip()


def render(result: EvalResult, verdict: GateVerdict) -> str:
    s = result.summary
    lines = [
        f"set {result.set_id} v{result.set_version} ({result.set_digest[:12]})  model {result.model}",
        f"{'case':<28} {'result':<6} {'ms':>8}  detail",
        *(_case_line(case) for case in result.cases),
        "",
        f"cases {s.cases}  passed {s.passed}  failed {s.failed}  errors {s.errors}  pass rate {s.pass_rate:.1%}",
        f"score {s.score:.1%}  set threshold {result.set_threshold:.1%}",
    ]
    if s.mean_latency_s is not None and s.p50_latency_s is not None:
        lines.append(f"latency mean {s.mean_latency_s * 1000:.0f} ms  p50 {s.p50_latency_s * 1000:.0f} ms")
    lines.append("gate: PASSED" if verdict.passed else "gate: FAILED")
    lines.extend(f"  - {reason}" for reason in verdict.reasons)
    return "\n".join(lines)


@click.command("run")
@_set_argument
@click.option("--base-url", required=True, help="Endpoint root, e.g. http://127.0.0.1:8000/v1.")
@click.option("--api-key", envvar="EVAL_API_KEY", default=None, help="Bearer key (or $EVAL_API_KEY).")
@click.option("--model", required=True, help="Model name sent in each request.")
@click.option(
    "--min-pass-rate",
    type=click.FloatRange(0, 1),
    default=None,
    help="Minimum weighted score; overrides the set's threshold (default: the set's threshold).",
)
@click.option("--max-errors", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--tag-min-pass-rate", multiple=True, metavar="TAG=RATE", help="Per-tag minimum pass rate.")
@click.option("--concurrency", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="Write the result and verdict as JSON.")
def run_command(
    set_path: Path,
    base_url: str,
    api_key: str | None,
    model: str,
    min_pass_rate: float | None,
    max_errors: int,
    tag_min_pass_rate: tuple[str, ...],
    concurrency: int,
    timeout_s: float,
    out: Path | None,
) -> None:
    """Run eval set SET against an OpenAI-compatible endpoint and apply the promotion gate."""
    eval_set = _load(set_path)
    if not base_url.startswith(("http://", "https://")):
        raise click.BadParameter("expected an http:// or https:// URL", param_hint="--base-url")
    thresholds = Thresholds(min_pass_rate, max_errors, _tag_thresholds(tag_min_pass_rate))
    result = asyncio.run(run_eval(eval_set, base_url, api_key, model, concurrency=concurrency, timeout_s=timeout_s))
    verdict = check_gate(result, thresholds)
    click.echo(render(result, verdict))
    if out is not None:
        document = {
            "result": result.model_dump(mode="json"),
            "gate": {
                "passed": verdict.passed,
                "reasons": list(verdict.reasons),
                "min_score": result.set_threshold if min_pass_rate is None else min_pass_rate,
            },
        }
        out.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
    if not verdict.passed:
        raise SystemExit(EXIT_GATE_FAILED)


@click.command("show")
@_set_argument
def show_command(set_path: Path) -> None:
    """Print the id, version, digest and case count of eval set SET."""
    eval_set = _load(set_path)
    click.echo(f"id       {eval_set.id}")
    click.echo(f"version  {eval_set.version}")
    click.echo(f"digest   sha256:{eval_set.digest}")
    click.echo(f"cases    {len(eval_set.cases)}")


def render_comparison(comparison: Comparison) -> str:
    c = comparison
    lines = [
        f"set {c.set_id} v{c.set_version} ({c.set_digest[:12]})",
        f"{'case':<28} {'A':<6} {'B':<6}",
        *(f"{row.case_id:<28} {row.a:<6} {row.b:<6}{'  changed' if row.changed else ''}".rstrip() for row in c.cases),
        "",
        f"score A {c.a_score:.1%} ({c.a_model})  B {c.b_score:.1%} ({c.b_model})  delta {c.delta * 100:+.1f} pts",
        "REGRESSION: B scores lower than A" if c.regressed else "no regression",
    ]
    return "\n".join(lines)


def _load_result(path: Path, hint: str) -> EvalResult:
    try:
        return load_result(path)
    except ResultFileError as error:
        raise click.BadParameter(str(error), param_hint=hint) from error


@click.command("compare")
@click.argument("a_path", metavar="A", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("b_path", metavar="B", type=click.Path(dir_okay=False, path_type=Path))
def compare_command(a_path: Path, b_path: Path) -> None:
    """Compare result JSON B against baseline A of the same set; exit 1 if B's score is lower."""
    a, b = _load_result(a_path, "A"), _load_result(b_path, "B")
    try:
        comparison = compare_results(a, b)
    except DigestMismatch as error:
        raise click.UsageError(f"refusing to compare: {error}") from error
    click.echo(render_comparison(comparison))
    if comparison.regressed:
        raise SystemExit(EXIT_REGRESSED)
