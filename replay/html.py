"""The self-contained HTML report: summary, charts, failures, lag and the definitions.

One file with inline CSS and SVG, no scripts and no external references, so it can be attached to
a ticket or opened from an air-gapped machine and look the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from replay.metrics import LATENCY_METRICS, PERCENTILES, metric_values
from replay.report import LATENCY_TITLES, ms, pct, records_of
from replay.svg import bar_chart, cdf_chart, scatter_chart

_STYLE = """
body{font-family:sans-serif;margin:2em;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1.5em}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
td.l,th.l{text-align:left}
.bad{color:#b00;font-weight:bold}.good{color:#070}
.charts{display:flex;flex-wrap:wrap;gap:1em}
dt{font-weight:bold;margin-top:0.6em}
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
        '<p class="good">Figures valid: the tool\'s own event-loop lag stayed within its limit.</p>'
        if document["valid"]
        else f'<p class="bad">INVALID: {escape("; ".join(document["problems"]))}</p>'
    )
    rows = [
        ("samples", str(run.get("samples"))),
        ("endpoint", str(run.get("base_url"))),
        ("load shape", str(run.get("shape"))),
        ("requests", f"{summary['requests']} ({summary['cancelled']} cancelled, not counted)"),
        ("success rate", f"{pct(summary['success_rate'])} ({summary['succeeded']} of {summary['requests']})"),
        ("goodput", pct(summary.get("goodput")) + _slo_text(summary)),
        ("throughput", f"{summary.get('requests_per_s') or 0:.2f} req/s, "
                       f"{summary.get('output_tokens_per_s') or 0:.1f} output tok/s"),
        ("wall time", f"{summary['wall_s']:.2f} s"),
    ]  # fmt: skip
    return state + _table(["", ""], rows, left=2)


def _slo_text(summary: Mapping[str, Any]) -> str:
    slos = summary.get("slos") or {}
    return " under " + ", ".join(f"{k}<={v * 1000:g} ms" for k, v in slos.items()) if slos else " (no --slo given)"


def _latency(summary: Mapping[str, Any]) -> str:
    header = ["metric (ms)", "n", *(f"p{q}" for q in PERCENTILES), "mean", "max"]
    rows = []
    for metric in LATENCY_METRICS:
        stats = summary["latency"][metric]
        cells = [ms(stats.get(f"p{q}"), 2) for q in PERCENTILES] + [ms(stats.get(k), 2) for k in ("mean", "max")]
        rows.append([LATENCY_TITLES[metric], str(stats["n"]), *cells])
    return _table(header, rows)


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


def _lag(lag: Mapping[str, Any]) -> str:
    rows = [[str(lag.get(key)) for key in ("samples", "p50_ms", "p99_ms", "max_ms", "limit_ms")]]
    verdict = escape(str(lag.get("reason", "")))
    return _table(["ticks", "p50 (ms)", "p99 (ms)", "max (ms)", "limit (ms)"], rows, left=0) + f"<p>{verdict}</p>"


def _gates(gates: Sequence[Mapping[str, Any]]) -> str:
    if not gates:
        return "<p>No gates.</p>"
    rows = [[g["gate"], "-" if g["value"] is None else f"{g['value']:.4g}", "pass" if g["passed"] else "FAIL"]
            for g in gates]  # fmt: skip
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
        ("Own event-loop lag", _lag(document["lag"])),
        ("Definitions", _definitions(document["definitions"])),
    ]
    body = "".join(f"<h2>{escape(title)}</h2>{content}" for title, content in sections)
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>replay report</title><style>{_STYLE}</style></head>"
        f"<body><h1>Replay report</h1>{body}</body></html>"
    )


def write_html(path: Path, document: Mapping[str, Any]) -> None:
    path.write_text(render_html(document), encoding="utf-8")
