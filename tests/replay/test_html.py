"""The HTML report is one self-contained file: charts as inline SVG, definitions, every request in a
sortable table, nothing fetched from anywhere."""

from __future__ import annotations

import re
from pathlib import Path

from replay.html import render_html, write_html
from replay.svg import nice_ticks
from tests.replay.test_compare import synthetic_run


def test_the_report_holds_the_charts_and_definitions_without_external_references(tmp_path: Path) -> None:
    document = synthetic_run(200, 20, failures=5)
    document["run"].update(samples="s.jsonl", base_url="http://127.0.0.1:9/v1")
    path = tmp_path / "report.html"
    write_html(path, document)
    page = path.read_text(encoding="utf-8")
    assert page.count("<svg") == 4
    for title in ("TTFT CDF", "TPOT CDF", "Latency over the run", "Failure reasons"):
        assert f"<title>{title}</title>" in page
    assert "Time to first token" in page
    assert "http_503" in page
    assert page.lower().count("<script") == 1, "one inline script: the table sort"
    assert not re.search(r"""(src|href)\s*=|@import|url\(""", page), "nothing is fetched from anywhere"


def test_text_from_the_run_is_escaped() -> None:
    document = synthetic_run(200, 20, n=5, failures=1)
    document["records"][0]["detail"] = document["summary"]["failures"][0]["example"]["detail"] = "<b>boom</b>"
    page = render_html(document)
    assert "<b>boom</b>" not in page
    assert "&lt;b&gt;boom&lt;/b&gt;" in page


def test_an_empty_run_still_renders() -> None:
    document = synthetic_run(200, 20, n=3, failures=3)
    page = render_html(document)
    assert "no data" in page


def test_axis_ticks_are_round_numbers_covering_the_range() -> None:
    assert nice_ticks(0, 230) == [0, 50, 100, 150, 200, 250]
    assert nice_ticks(0, 1.0) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]


def test_the_report_lists_every_request_in_a_sortable_table() -> None:
    document = synthetic_run(200, 20, n=7, failures=2)
    page = render_html(document)
    table = page[page.index('<table class="sortable">') :]
    table = table[: table.index("</table>")]
    for column in ("status", "finish", "TTFT ms", "TPOT ms", "tokens", "tool call", "client delay ms"):
        assert f"<th>{column}</th>" in table
    assert table.count("<tr>") == 1 + 7
    assert "http_503" in table
    assert "addEventListener('click'" in page
