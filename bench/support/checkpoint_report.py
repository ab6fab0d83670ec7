"""Sessions on vs off per store and scenario: medians over rounds, per-round ratios, Markdown.

Ratios are medians of per-round ratios (on and off measured moments apart in the same round), not
ratios of medians: that is what the alternating rounds are for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.support.checkpoint_rounds import Window
from bench.support.harness import cell, markdown
from bench.support.runner import median_of

TARGET_RATIO = 0.9


@dataclass(frozen=True)
class Side:
    """One gateway (sessions on, or off) in one scenario, as medians over the rounds."""

    rps: float | None
    chunks_per_s: float | None
    sustained_rps: float | None
    p50_ms: float | None
    ttft_ms: float | None
    cpu_ms: float | None
    cpu_ms_with_drain: float | None
    drain_s: float | None
    drain_max_s: float | None
    unsettled: int  # windows after which the gateway never idled within the cap
    backlog: float | None  # sessions first checkpointed only after the window ended
    backlog_max: float | None
    backlog_share: float | None  # backlog / the window's requests
    errors: int


@dataclass(frozen=True)
class Ratio:
    median: float | None
    low: float | None
    high: float | None


@dataclass(frozen=True)
class Row:
    store: str
    scenario: str
    on: Side
    off: Side
    ratio: Ratio  # window req/s, on / off
    sustained_ratio: Ratio  # req/s with the drain counted, on / off


def _median(windows: Sequence[Window], get: Callable[[Window], float | None]) -> float | None:
    return median_of([get(w) for w in windows])


def _backlog_share(window: Window) -> float | None:
    n = window.figures.requests
    return None if window.backlog is None or not n else window.backlog / n


def side(windows: Sequence[Window], chunks: int) -> Side:
    rps = _median(windows, lambda w: w.figures.rps)
    return Side(
        rps=rps,
        chunks_per_s=None if rps is None else rps * chunks,
        sustained_rps=_median(windows, lambda w: w.sustained_rps),
        p50_ms=_median(windows, lambda w: w.figures.p50_ms),
        ttft_ms=_median(windows, lambda w: w.figures.ttft_p50_ms),
        cpu_ms=_median(windows, lambda w: w.figures.proxy_cpu_ms_per_req),
        cpu_ms_with_drain=_median(windows, lambda w: w.cpu_ms_per_req_with_drain),
        drain_s=_median(windows, lambda w: w.drain.seconds),
        drain_max_s=max((w.drain.seconds for w in windows), default=None),
        unsettled=sum(not w.drain.settled for w in windows),
        backlog=_median(windows, lambda w: w.backlog),
        backlog_max=max((w.backlog for w in windows if w.backlog is not None), default=None),
        backlog_share=_median(windows, _backlog_share),
        errors=sum(w.figures.errors for w in windows),
    )


def ratio(on: dict[int, Window], off: dict[int, Window], get: Callable[[Window], float]) -> Ratio:
    each = [get(on[r]) / get(off[r]) for r in on if r in off and get(off[r]) > 0]
    return Ratio(median_of(list(each)), min(each, default=None), max(each, default=None))


def _by_round(windows: Sequence[Window], scenario: str, path: str) -> dict[int, Window]:
    return {w.figures.round: w for w in windows if w.figures.scenario == scenario and w.figures.path == path}


def row(windows: Sequence[Window], store: str, scenario: str, chunks: int) -> Row:
    on = _by_round(windows, scenario, f"{store} sessions on")
    off = _by_round(windows, scenario, f"{store} sessions off")
    return Row(
        store=store,
        scenario=scenario,
        on=side(list(on.values()), chunks),
        off=side(list(off.values()), chunks),
        ratio=ratio(on, off, lambda w: w.figures.rps),
        sustained_ratio=ratio(on, off, lambda w: w.sustained_rps),
    )


def _pair(on: float | None, off: float | None, digits: int = 0) -> str:
    return f"{cell(on, digits)} / {cell(off, digits)}"


def _ratio(value: Ratio) -> str:
    return f"{cell(value.median, 3)} ({cell(value.low, 3)}-{cell(value.high, 3)})"


def _met(value: Ratio) -> str:
    return "-" if value.median is None else ("yes" if value.median >= TARGET_RATIO else "no")


def markdown_throughput(rows: Sequence[Row]) -> str:
    head = (
        "| store | scenario | req/s on / off | chunks/s on / off | on/off (min-max) "
        f"| >= {TARGET_RATIO:g} | sustained req/s on / off | sustained on/off (min-max) | >= {TARGET_RATIO:g} "
        "| errors |"
    )
    return markdown(head, [_throughput_cells(r) for r in rows])


def _throughput_cells(r: Row) -> list[str]:
    cells = [r.store, r.scenario, _pair(r.on.rps, r.off.rps), _pair(r.on.chunks_per_s, r.off.chunks_per_s)]
    cells += [_ratio(r.ratio), _met(r.ratio), _pair(r.on.sustained_rps, r.off.sustained_rps)]
    cells += [_ratio(r.sustained_ratio), _met(r.sustained_ratio), str(r.on.errors + r.off.errors)]
    return cells


def _backlog(on: Side) -> str:
    if on.backlog is None:
        return "-"
    share = "-" if on.backlog_share is None else f"{on.backlog_share:.0%}"
    return f"{on.backlog:,.0f} ({cell(on.backlog_max, 0)}), {share}"


def markdown_costs(rows: Sequence[Row]) -> str:
    head = (
        "| store | scenario | p50 ms on / off | TTFT p50 ms on / off | gateway CPU ms/req on / off "
        "| CPU ms/req with drain on / off | drain s on / off (max on) | never idled "
        "| checkpoint backlog at window end, sessions: median (max), share of window |"
    )
    return markdown(head, [_cost_cells(r) for r in rows])


def _cost_cells(r: Row) -> list[str]:
    on, off = r.on, r.off
    cells = [r.store, r.scenario, _pair(on.p50_ms, off.p50_ms, 2), _pair(on.ttft_ms, off.ttft_ms, 2)]
    cells += [_pair(on.cpu_ms, off.cpu_ms, 2), _pair(on.cpu_ms_with_drain, off.cpu_ms_with_drain, 2)]
    cells += [
        f"{_pair(on.drain_s, off.drain_s, 1)} ({cell(on.drain_max_s, 1)})",
        str(on.unsettled + off.unsettled),
    ]
    cells.append(_backlog(on))
    return cells
