"""The self-contained HTML report: summary, charts, failures, client delay, every request and the
definitions.

One file with inline CSS, SVG and a few lines of inline script (clicking a column header of the
per-request table sorts it), no external references, so it can be attached to a ticket or opened
from an air-gapped machine and look the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from replay.metrics import PERCENTILES, metric_values
from replay.report import PER_REQUEST_COLUMNS, latency_rows, ms, pct, per_request_rows, records_of
from replay.svg import bar_chart, cdf_chart, scatter_chart

_STYLE = """
body{font-family:sans-serif;margin:2em;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1.5em}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
td.l,th.l{text-align:left}
.bad{color:#b00;font-weight:bold}.good{color:#070}
.charts{display:flex;flex-wrap:wrap;gap:1em}
dt{font-weight:bold;margin-top:0.6em}
table.sortable th{cursor:pointer;background:#f4f4f4}
"""
# Sorts the per-request table by the clicked column: numerically when both cells are numbers.
_SORT_SCRIPT = """
document.querySelectorAll('table.sortable th').forEach(function(th, col) {
  th.addEventListener('click', function() {
    var table = th.closest('table'), body = table.tBodies[0];
    var up = th.dataset.dir !== 'asc'; th.dataset.dir = up ? 'asc' : 'desc';
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function(a, b) {
      var x = a.cells[col].textContent, y = b.cells[col].textContent;
      var nx = parseFloat(x), ny = parseFloat(y);
      var c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
      return up ? c : -c;
    });
    rows.forEach(function(row) { body.appendChild(row); });
  });
});
"""


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> str:
    def cell(tag: str, n: int, text: str) -> str:
        return f"<{tag}{' class=l' if n < left else ''}>{escape(text)}</{tag}>"

    head = "".join(cell("th", n, text) for n, text in enumerate(header))
    body = "".join("<tr>" + "".join(cell("td", n, text) for n, text in enumerate(row)) + "</tr>" for row in rows)
    return f"<table>{f'<tr>{head}</tr>' if any(header) else ''}{body}</table>"


def _headline(document: Mapping[str, Any]) -> str:
    run, summary = document["run"], document["summary"]
    state = (
        "<p class=\"good\">Figures valid: the tool's own delay left most requests' timing untouched.</p>"
        if document["valid"]
        else f'<p class="bad">INVALID: {escape("; ".join(document["problems"]))}</p>'
    )
    if document.get("aborted"):
        state += f'<p class="bad">STOPPED EARLY: {escape(document["aborted"])}</p>'
    state += "".join(f"<p><b>Hint:</b> {escape(hint)}</p>" for hint in summary.get("hints", []))
    rows = [
        ("samples", str(run.get("samples"))),
        ("endpoint", str(run.get("base_url"))),
        ("load shape", str(run.get("shape"))),
        ("requests", f"{summary['requests']} ({summary['cancelled']} cancelled, not counted)"),
        ("success rate", f"{pct(summary['success_rate'])} ({summary['succeeded']} of {summary['requests']})"),
        ("length cut-offs", str(summary.get("length_cutoffs", 0))),
        ("tool calls", _tool_text(summary.get("tool_calls", {}))),
        ("goodput", pct(summary.get("goodput")) + _slo_text(summary)),
        (
            "throughput",
            f"{summary.get('requests_per_s') or 0:.2f} req/s, "
            f"{summary.get('output_tokens_per_s') or 0:.1f} output tok/s",
        ),
        ("wall time", f"{summary['wall_s']:.2f} s"),
    ]
    return state + _table(["", ""], rows, left=2)


def _tool_text(tools: Mapping[str, Any]) -> str:
    if not tools.get("expected") and not tools.get("not_expected"):
        return f"{tools.get('with_tool_call', 0)} answers carried a tool call (no expect_tool_call in the samples)"
    return (
        f"{tools['expected_and_got']} of {tools['expected']} that expected one got one; "
        f"{tools['not_expected_but_got']} of {tools['not_expected']} that expected none made one"
    )


def _slo_text(summary: Mapping[str, Any]) -> str:
    slos = summary.get("slos") or {}
    return " under " + ", ".join(f"{k}<={v * 1000:g} ms" for k, v in slos.items()) if slos else " (no --slo given)"


def _latency(summary: Mapping[str, Any]) -> str:
    header = ["metric (ms)", "n", *(f"p{q}" for q in PERCENTILES), "mean", "max"]
    rows = []
    for title, stats in latency_rows(summary):
        cells = [ms(stats.get(f"p{q}"), 2) for q in PERCENTILES] + [ms(stats.get(k), 2) for k in ("mean", "max")]
        rows.append([title, str(stats["n"]), *cells])
    excluded = summary.get("tpot_excluded") or {}
    note = "".join(f"<p>No TPOT for {n} requests: {escape(reason)}.</p>" for reason, n in sorted(excluded.items()))
    return _table(header, rows) + note


def _failures(summary: Mapping[str, Any]) -> str:
    rows = [
        [
            row["reason"],
            row["group"],
            row["label"],
            str(row["count"]),
            "yes" if row["is_failure"] else "no",
            f"#{row['example']['index']} {row['example']['sample_id']}: {row['example']['detail']}",
        ]
        for row in summary["failures"]
    ]
    if not rows:
        return "<p>No failures.</p>"
    return _table(["reason", "group", "meaning", "count", "failure", "example"], rows, left=6)


def _charts(document: Mapping[str, Any]) -> str:
    records = records_of(document)
    to_ms = [(name, [v * 1000 for v in metric_values(records, name)]) for name in ("ttft", "tpot")]
    ok = [r for r in records if r.ok]
    over_time = [
        ("E2E", [(r.start_s, r.e2e_s * 1000) for r in ok if r.e2e_s is not None]),
        ("TTFT", [(r.start_s, r.ttft_s * 1000) for r in ok if r.ttft_s is not None]),
        ("failed", [(r.start_s, (r.e2e_s or 0.0) * 1000) for r in records if not r.ok and r.reason != "cancelled"]),
    ]
    bars = [(row["reason"], row["count"], row["is_failure"]) for row in document["summary"]["failures"]]
    charts = [
        cdf_chart("TTFT CDF", [to_ms[0]], "TTFT (ms)"),
        cdf_chart("TPOT CDF", [to_ms[1]], "TPOT (ms)"),
        scatter_chart("Latency over the run", over_time, "request dispatched at (s from start)", "latency (ms)"),
        bar_chart("Failure reasons", bars),
    ]
    return '<div class="charts">' + "".join(charts) + "</div>"


def _timing(summary: Mapping[str, Any]) -> str:
    timing = summary.get("timing")
    if not timing:
        return "<p>Not recorded.</p>"
    header = ["", "n", *(f"p{q} (ms)" for q in PERCENTILES), "max (ms)"]
    rows = []
    for name, key in (("client delay", "client_delay"), ("dispatch lateness", "dispatch_late")):
        stats = timing[key]
        rows.append([name, str(stats["n"]), *(ms(stats.get(f"p{q}"), 2) for q in PERCENTILES), ms(stats.get("max"), 2)])
    text = (
        f"<p>{timing['excluded']} of {timing['excluded'] + timing['measured']} requests were left out of the latency "
        "figures because the tool's own delay could have distorted them (see Client delay below).</p>"
    )
    return text + _table(header, rows)


def _per_request(document: Mapping[str, Any]) -> str:
    head = "".join(f"<th>{escape(name)}</th>" for name in PER_REQUEST_COLUMNS)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in row) + "</tr>" for row in per_request_rows(document)
    )
    return f'<table class="sortable"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _gates(gates: Sequence[Mapping[str, Any]]) -> str:
    if not gates:
        return "<p>No gates.</p>"
    rows = [
        [g["gate"], "-" if g["value"] is None else f"{g['value']:.4g}", "pass" if g["passed"] else "FAIL"]
        for g in gates
    ]
    return _table(["gate", "value", "result"], rows)


def _definitions(definitions: Mapping[str, str]) -> str:
    items = "".join(f"<dt>{escape(name)}</dt><dd>{escape(text)}</dd>" for name, text in definitions.items())
    return f"<dl>{items}</dl>"


def render_html(document: Mapping[str, Any]) -> str:
    summary = document["summary"]
    sections = [
        ("Run", _headline(document)),
        ("Latency", _latency(summary)),
        ("Charts", _charts(document)),
        ("Failures", _failures(summary)),
        ("Gates", _gates(document["gates"])),
        ("Own client delay", _timing(summary)),
        ("Requests (click a header to sort)", _per_request(document)),
        ("Definitions", _definitions(document["definitions"])),
    ]
    body = "".join(f"<h2>{escape(title)}</h2>{content}" for title, content in sections)
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>replay report</title><style>{_STYLE}</style></head>"
        f"<body><h1>Replay report</h1>{body}<script>{_SORT_SCRIPT}</script></body></html>"
    )


def write_html(path: Path, document: Mapping[str, Any]) -> None:
    path.write_text(render_html(document), encoding="utf-8")
