"""The run's result as a JSON document, and its terminal summary.

The JSON result file holds everything: the run's configuration, the definitions, the summary, the
lag verdict, the gates and every request record with its raw arrival times, so that `compare`
and any later analysis work from the file alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from replay import RESULT_SCHEMA
from replay.metrics import DEFINITIONS, LATENCY_METRICS, PERCENTILES
from replay.record import RequestRecord

LATENCY_TITLES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E", "setup": "setup"}


# The definitions in brief, under the table, because tools disagree on them (full text in the JSON
# result's `definitions` and in the HTML report).
LEGEND = "\n".join(
    (
        "  TTFT: request written -> first chunk with content, reasoning or a tool call (role-only chunk excluded)",
        "  TPOT: (E2E - TTFT) / (output tokens - 1)    ITL: every gap between output chunks",
        "  E2E: request written -> [DONE]    setup: dispatch -> request written (pool wait, connect; not in TTFT)",
    )
)


class ResultError(ValueError):
    """A result file that cannot be read as a replay result."""


def result_document(
    *,
    run: Mapping[str, Any],
    records: Sequence[RequestRecord],
    summary: Mapping[str, Any],
    lag: Mapping[str, Any],
    gates: Sequence[Mapping[str, Any]],
    problems: Sequence[str],
) -> dict[str, Any]:
    return {
        "schema": RESULT_SCHEMA,
        "valid": not problems,
        "problems": list(problems),
        "run": dict(run),
        "definitions": dict(DEFINITIONS),
        "summary": dict(summary),
        "lag": dict(lag),
        "gates": [dict(gate) for gate in gates],
        "records": [record.to_json() for record in records],
    }


def write_result(path: Path, document: Mapping[str, Any]) -> None:
    path.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))


def load_result(path: Path) -> dict[str, Any]:
    try:
        document = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ResultError(f"cannot read result {path}: {exc}") from exc
    if not isinstance(document, dict) or document.get("schema") != RESULT_SCHEMA:
        raise ResultError(f"{path} is not a replay result ({RESULT_SCHEMA})")
    return document


def records_of(document: Mapping[str, Any]) -> list[RequestRecord]:
    return [RequestRecord.from_json(item) for item in document.get("records", [])]


def ms(value: Any, digits: int = 1) -> str:
    return "-" if not isinstance(value, int | float) else f"{value * 1000:.{digits}f}"


def pct(value: Any) -> str:
    return "-" if not isinstance(value, int | float) else f"{value * 100:.1f}%"


def render_summary(document: Mapping[str, Any]) -> str:
    """The terminal summary: headline, latency table, failures, lag and gates."""
    parts = [
        _headline(document),
        _latency_table(document["summary"]["latency"]),
        LEGEND,
        _failures(document["summary"]["failures"]),
        _lag_line(document["lag"]),
        *_gate_lines(document["gates"]),
    ]
    if document["problems"]:
        parts.append("INVALID: " + "; ".join(document["problems"]))
    return "\n".join(part for part in parts if part)


def _headline(document: Mapping[str, Any]) -> str:
    run, summary = document["run"], document["summary"]
    shape = run.get("shape", "")
    lines = [
        f"replay {run.get('samples', '')} -> {run.get('base_url', '')}  ({shape})",
        f"requests {summary['requests']}  succeeded {summary['succeeded']}  failed {summary['failed']}"
        f"  cancelled {summary['cancelled']}  success rate {pct(summary['success_rate'])}",
    ]
    if summary.get("goodput") is not None:
        slos = ", ".join(f"{name}<={limit * 1000:g}ms" for name, limit in summary["slos"].items())
        lines.append(f"goodput {pct(summary['goodput'])} ({summary['met_slos']} requests met {slos})")
    rps, tps = summary.get("requests_per_s"), summary.get("output_tokens_per_s")
    sources = ", ".join(f"{k} {v}" for k, v in sorted(summary.get("tokens_source", {}).items()))
    lines.append(
        f"wall {summary['wall_s']:.2f} s  {rps or 0:.2f} req/s  {tps or 0:.1f} output tok/s"
        f"  (output tokens from: {sources or 'n/a'})"
    )
    return "\n".join(lines)


def _latency_table(latency: Mapping[str, Mapping[str, Any]]) -> str:
    header = f"{'metric (ms)':<12}{'n':>7}" + "".join(f"{'p' + str(q):>10}" for q in PERCENTILES)
    header += f"{'mean':>10}{'max':>10}"
    rows = [header]
    for metric in LATENCY_METRICS:
        stats = latency[metric]
        cells = "".join(f"{ms(stats.get(f'p{q}')):>10}" for q in PERCENTILES)
        rows.append(
            f"{LATENCY_TITLES[metric]:<12}{stats['n']:>7}{cells}{ms(stats.get('mean')):>10}{ms(stats.get('max')):>10}"
        )
    return "\n".join(rows)


def _failures(rows: Sequence[Mapping[str, Any]]) -> str:
    if not rows:
        return "failures: none"
    lines = ["failures:", f"  {'reason':<22}{'group':<11}{'count':>6}  {'fails':<6}example"]
    for row in rows:
        example = row["example"]
        text = f"#{example['index']} {example['sample_id']}: {example['detail']}"
        lines.append(
            f"  {row['reason']:<22}{row['group']:<11}{row['count']:>6}  {'yes' if row['is_failure'] else 'no':<6}"
            f"{text[:90]}"
        )
    return "\n".join(lines)


def _lag_line(lag: Mapping[str, Any]) -> str:
    state = "ok" if lag.get("valid") else "TOO HIGH"
    return (
        f"own event-loop lag: p50 {lag.get('p50_ms')} ms  p99 {lag.get('p99_ms')} ms  max {lag.get('max_ms')} ms"
        f"  ({lag.get('samples')} ticks, limit {lag.get('limit_ms')} ms) {state}"
    )


def _gate_lines(gates: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = []
    for gate in gates:
        value = gate["value"]
        shown = "-" if value is None else f"{value:.4g}"
        lines.append(f"gate {gate['gate']}: {shown} {'pass' if gate['passed'] else 'FAIL'}")
    return lines
