"""The run's result as a JSON document, and its terminal summary.

The JSON result file holds everything: the run's configuration and workload digest, the
definitions, the summary, the gates and every request record with its raw arrival times and its
client delay, so that `compare` and any later analysis work from the file alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from replay import READABLE_SCHEMAS, RESULT_SCHEMA
from replay.metrics import DEFINITIONS, LATENCY_METRICS, PERCENTILES
from replay.record import RequestRecord

LATENCY_TITLES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E", "setup": "setup"}


# The definitions in brief, under the table, because tools disagree on them (full text in the JSON
# result's `definitions` and in the HTML report).
LEGEND = "\n".join(
    (
        "  TTFT: just before the request's first byte is written -> first chunk with content, reasoning or a tool"
        " call (role-only chunk excluded)",
        "  TPOT: (E2E - TTFT) / (output tokens - 1) per request (tok-w: weighted by tokens)    ITL: every gap"
        " between output chunks",
        "  E2E: same start -> [DONE]    setup: dispatch -> that start (pool wait, connect; not in TTFT)",
    )
)


class ResultError(ValueError):
    """A result file that cannot be read as a replay result."""


def result_document(
    *,
    run: Mapping[str, Any],
    records: Sequence[RequestRecord],
    summary: Mapping[str, Any],
    gates: Sequence[Mapping[str, Any]],
    problems: Sequence[str],
    aborted: str | None = None,
) -> dict[str, Any]:
    return {
        "schema": RESULT_SCHEMA,
        "valid": not problems,
        "problems": list(problems),
        "aborted": aborted,
        "run": dict(run),
        "definitions": dict(DEFINITIONS),
        "summary": dict(summary),
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
    if not isinstance(document, dict) or document.get("schema") not in READABLE_SCHEMAS:
        raise ResultError(f"{path} is not a replay result ({RESULT_SCHEMA})")
    return document


def records_of(document: Mapping[str, Any]) -> list[RequestRecord]:
    return [RequestRecord.from_json(item) for item in document.get("records", [])]


def ms(value: Any, digits: int = 1) -> str:
    return "-" if not isinstance(value, int | float) else f"{value * 1000:.{digits}f}"


def pct(value: Any) -> str:
    return "-" if not isinstance(value, int | float) else f"{value * 100:.1f}%"


def render_summary(document: Mapping[str, Any]) -> str:
    """The terminal summary: headline, latency table, failures, client delay and gates."""
    summary = document["summary"]
    parts = [
        _headline(document),
        _latency_table(summary),
        LEGEND,
        _tool_line(summary.get("tool_calls", {})),
        _failures(summary["failures"]),
        _timing_line(summary.get("timing")),
        *_gate_lines(document["gates"]),
        *(f"hint: {hint}" for hint in summary.get("hints", [])),
    ]
    if document.get("aborted"):
        parts.append(f"STOPPED EARLY: {document['aborted']}")
    if document["problems"]:
        parts.append("INVALID: " + "; ".join(document["problems"]))
    return "\n".join(part for part in parts if part)


def _headline(document: Mapping[str, Any]) -> str:
    run, summary = document["run"], document["summary"]
    shape = run.get("shape", "")
    lines = [
        f"replay {run.get('samples', '')} -> {run.get('base_url', '')}  ({shape})",
        f"requests {summary['requests']}  succeeded {summary['succeeded']}  failed {summary['failed']}"
        f"  length cut-offs {summary.get('length_cutoffs', 0)}  cancelled {summary['cancelled']}"
        f"  success rate {pct(summary['success_rate'])}",
    ]
    if summary.get("goodput") is not None:
        slos = ", ".join(f"{name}<={limit * 1000:g}ms" for name, limit in summary["slos"].items())
        unjudged = summary.get("unjudged_slos") or 0
        note = f"; {unjudged} missed under client delay, not judged" if unjudged else ""
        lines.append(f"goodput {pct(summary['goodput'])} ({summary['met_slos']} requests met {slos}{note})")
    rps, tps = summary.get("requests_per_s"), summary.get("output_tokens_per_s")
    sources = ", ".join(f"{k} {v}" for k, v in sorted(summary.get("tokens_source", {}).items()))
    lines.append(
        f"wall {summary['wall_s']:.2f} s  {rps or 0:.2f} req/s  {tps or 0:.1f} output tok/s"
        f"  (output tokens from: {sources or 'n/a'})"
    )
    return "\n".join(lines)


def latency_rows(summary: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(title, distribution) per latency row; token-weighted TPOT follows TPOT when present."""
    rows: list[tuple[str, Mapping[str, Any]]] = []
    for metric in LATENCY_METRICS:
        rows.append((LATENCY_TITLES[metric], summary["latency"][metric]))
        if metric == "tpot" and "tpot_token_weighted" in summary:
            rows.append(("TPOT tok-w", summary["tpot_token_weighted"]))
    return rows


def _latency_table(summary: Mapping[str, Any]) -> str:
    header = f"{'metric (ms)':<12}{'n':>7}" + "".join(f"{'p' + str(q):>10}" for q in PERCENTILES)
    header += f"{'mean':>10}{'max':>10}"
    rows = [header]
    for title, stats in latency_rows(summary):
        cells = "".join(f"{ms(stats.get(f'p{q}')):>10}" for q in PERCENTILES)
        rows.append(f"{title:<12}{stats['n']:>7}{cells}{ms(stats.get('mean')):>10}{ms(stats.get('max')):>10}")
    excluded = summary.get("tpot_excluded") or {}
    if excluded:
        rows.append("  no TPOT for: " + ", ".join(f"{n} ({reason})" for reason, n in sorted(excluded.items())))
    return "\n".join(rows)


def _tool_line(tools: Mapping[str, Any]) -> str:
    if not tools.get("expected") and not tools.get("not_expected"):
        return ""
    return (
        f"tool calls: {tools['expected_and_got']} of {tools['expected']} requests that expected one got one;"
        f" {tools['not_expected_but_got']} of {tools['not_expected']} that expected none made one"
    )


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


def _timing_line(timing: Mapping[str, Any] | None) -> str:
    if not timing:
        return ""
    delay, late = timing["client_delay"], timing["dispatch_late"]
    return (
        f"own client delay: {timing['excluded']} of {timing['excluded'] + timing['measured']} requests excluded"
        f" from latency (delay p50 {ms(delay.get('p50'), 2)} ms, max {ms(delay.get('max'), 2)} ms);"
        f" dispatch lateness p99 {ms(late.get('p99'), 2)} ms, max {ms(late.get('max'), 2)} ms"
    )


PER_REQUEST_COLUMNS = (
    "#",
    "sample",
    "status",
    "result",
    "finish",
    "TTFT ms",
    "TPOT ms",
    "E2E ms",
    "tokens",
    "tool call",
    "client delay ms",
    "timing",
)


def per_request_rows(document: Mapping[str, Any]) -> list[list[str]]:
    """One row per request, in dispatch order: the detail behind the summary."""
    rows = []
    for record in document.get("records", []):
        expected = record.get("expect_tool_call")
        tool = "yes" if record.get("tool_call") else "no"
        if expected is not None:
            tool += f" (expected {'yes' if expected else 'no'})"
        tpot = ms(record.get("tpot_s"), 2) if record.get("tpot_s") is not None else (record.get("tpot_excluded") or "-")
        rows.append(
            [
                str(record["index"]),
                str(record["sample_id"]),
                str(record.get("status") or "-"),
                "ok" if record.get("ok") else str(record.get("reason")),
                str(record.get("finish_reason") or "-"),
                ms(record.get("ttft_s"), 2),
                tpot,
                ms(record.get("e2e_s"), 2),
                str(record.get("output_tokens") or "-"),
                tool,
                ms(record.get("client_delay_s"), 2),
                "ok" if record.get("timing_ok", True) else "excluded",
            ]
        )
    return rows


def render_per_request(document: Mapping[str, Any]) -> str:
    rows = [list(PER_REQUEST_COLUMNS), *per_request_rows(document)]
    widths = [min(40, max(len(row[n]) for row in rows)) for n in range(len(PER_REQUEST_COLUMNS))]
    return "\n".join("  ".join(cell[:40].ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows)


def _gate_lines(gates: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = []
    for gate in gates:
        value = gate["value"]
        shown = "-" if value is None else f"{value:.4g}"
        lines.append(f"gate {gate['gate']}: {shown} {'pass' if gate['passed'] else 'FAIL'}")
    return lines
