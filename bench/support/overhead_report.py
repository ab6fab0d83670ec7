"""Medians across rounds, what each proxy adds over going direct, the target ratios, and the
Markdown table for the README.

"Added" figures are medians of per-round differences (proxy minus direct in the same round, which
ran moments apart), not differences of medians: that is what the alternating rounds are for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bench.support.harness import cell, markdown, yes_no
from bench.support.runner import Figures, Scenario, median_of

DIRECT = "direct"


@dataclass(frozen=True)
class Row:
    """One scenario on one path, as medians over the rounds."""

    scenario: str
    path: str
    rounds: int
    errors: int
    rps: float | None
    p50_ms: float | None
    p99_ms: float | None
    ttft_p50_ms: float | None
    gap_ms: float | None
    added_p50_ms: float | None
    added_ttft_ms: float | None
    added_gap_ms: float | None
    cpu_ms_per_req: float | None


def _added(windows: Sequence[Figures], direct: dict[int, Figures], field: str) -> float | None:
    deltas: list[float | None] = []
    for window in windows:
        base = direct.get(window.round)
        mine, theirs = getattr(window, field), getattr(base, field, None)
        deltas.append(mine - theirs if mine is not None and theirs is not None else None)
    return median_of(deltas)


def _row(scenario: str, path: str, windows: Sequence[Figures], direct: dict[int, Figures]) -> Row:
    proxied = path != DIRECT
    return Row(
        scenario=scenario,
        path=path,
        rounds=len(windows),
        errors=sum(w.errors for w in windows),
        rps=median_of([w.rps for w in windows]),
        p50_ms=median_of([w.p50_ms for w in windows]),
        p99_ms=median_of([w.p99_ms for w in windows]),
        ttft_p50_ms=median_of([w.ttft_p50_ms for w in windows]),
        gap_ms=median_of([w.gap_ms for w in windows]),
        added_p50_ms=_added(windows, direct, "p50_ms") if proxied else None,
        added_ttft_ms=_added(windows, direct, "ttft_p50_ms") if proxied else None,
        added_gap_ms=_added(windows, direct, "gap_ms") if proxied else None,
        cpu_ms_per_req=median_of([w.proxy_cpu_ms_per_req for w in windows]),
    )


def rows(figures: Sequence[Figures], scenarios: Sequence[Scenario], paths: Sequence[str]) -> list[Row]:
    result = []
    for scenario in scenarios:
        mine = [f for f in figures if f.scenario == scenario.name]
        direct = {f.round: f for f in mine if f.path == DIRECT}
        for path in paths:
            windows = [f for f in mine if f.path == path]
            if windows:
                result.append(_row(scenario.name, path, windows, direct))
    return result


@dataclass(frozen=True)
class Ratio:
    name: str
    value: float | None
    target: str
    met: bool | None


def _find(table: Sequence[Row], scenario: Scenario, path: str) -> Row | None:
    return next((r for r in table if r.scenario == scenario.name and r.path == path), None)


def _field(row: Row | None, name: str) -> float | None:
    value = getattr(row, name, None)
    return float(value) if value is not None else None


def _quotient(top: float | None, bottom: float | None) -> float | None:
    return top / bottom if top is not None and bottom else None


def _ratio(name: str, value: float | None, at_most: float | None = None, at_least: float | None = None) -> Ratio:
    if at_most is not None:
        return Ratio(name, value, f"<= {at_most:g}", None if value is None else value <= at_most)
    assert at_least is not None
    return Ratio(name, value, f">= {at_least:g}", None if value is None else value >= at_least)


def ratios(table: Sequence[Row], scenarios: Sequence[Scenario]) -> list[Ratio]:
    """The performance targets (issue 18 of the tracker): each a figure of this gateway alone or a
    ratio to a peer measured in the same run. A peer that was not measured leaves its ratio open."""
    result = []
    low = min(s.concurrency for s in scenarios)
    high = max(s.concurrency for s in scenarios)
    for scenario in scenarios:
        ours = _find(table, scenario, "gateway")
        litellm, portkey = _find(table, scenario, "litellm"), _find(table, scenario, "portkey")
        kind = "streaming" if scenario.stream else "non-streaming"
        if scenario.concurrency == low and not scenario.stream:
            added = _field(ours, "added_p50_ms")
            result.append(_ratio(f"c={low} {kind}: gateway added p50 (ms)", added, at_most=0.6))
        if scenario.concurrency == low:
            added = _quotient(_field(ours, "added_p50_ms"), _field(litellm, "added_p50_ms"))
            result.append(_ratio(f"c={low} {kind}: added p50, gateway / LiteLLM", added, at_most=0.1))
        if scenario.concurrency == high:
            rps = _quotient(_field(ours, "rps"), _field(litellm, "rps"))
            result.append(
                _ratio(f"c={high} {kind}: req/s, gateway / LiteLLM", rps, at_least=15 if not scenario.stream else 10)
            )
            if not scenario.stream:
                rps = _quotient(_field(ours, "rps"), _field(portkey, "rps"))
                result.append(_ratio(f"c={high} {kind}: req/s, gateway / Portkey", rps, at_least=2))
            tail = _quotient(_field(ours, "p99_ms"), _field(ours, "p50_ms"))
            result.append(_ratio(f"c={high} {kind}: gateway p99 / p50", tail, at_most=2.5))
            cpu = _field(ours, "cpu_ms_per_req")
            result.append(
                _ratio(f"c={high} {kind}: gateway CPU ms per request", cpu, at_most=0.8 if scenario.stream else 0.7)
            )
            # Issues 31 and 32: each other surface costs at most 15% more CPU per request than chat.
            surfaces = (
                ("gateway-responses", "Responses (kept)"),
                ("gateway-responses-unkept", "Responses (store: false)"),
                ("gateway-messages", "Messages"),
            )
            for path, label in surfaces:
                surface = _quotient(_field(_find(table, scenario, path), "cpu_ms_per_req"), cpu)
                result.append(_ratio(f"c={high} {kind}: CPU per request, {label} / chat", surface, at_most=1.15))
        if scenario.stream and scenario.concurrency == low:
            gap = _field(ours, "added_gap_ms")
            result.append(_ratio(f"c={low} streaming: gateway per-chunk overhead (ms)", gap, at_most=0.1))
    return result


def missed(items: Sequence[Ratio]) -> list[Ratio]:
    """The targets measured and not met (an unmeasured one is neither)."""
    return [i for i in items if i.met is False]


def markdown_table(table: Sequence[Row]) -> str:
    head = (
        "| scenario | path | req/s | p50 ms | p99 ms | TTFT p50 ms | chunk gap ms "
        "| +p50 ms | +TTFT ms | +per-chunk ms | proxy CPU ms/req |"
    )
    return markdown(head, [_cells(r) for r in table])


def _cells(r: Row) -> list[str]:
    return [
        r.scenario,
        r.path + (f" ({r.errors} errors)" if r.errors else ""),
        cell(r.rps, 0),
        cell(r.p50_ms, 3),
        cell(r.p99_ms, 3),
        cell(r.ttft_p50_ms, 3),
        cell(r.gap_ms, 4),
        cell(r.added_p50_ms, 3),
        cell(r.added_ttft_ms, 3),
        cell(r.added_gap_ms, 4),
        cell(r.cpu_ms_per_req, 3),
    ]


def markdown_ratios(items: Sequence[Ratio]) -> str:
    head = ["target", "value", "goal", "met"]
    return markdown(head, [[i.name, cell(i.value, 3), i.target, yes_no(i.met)] for i in items])


def markdown_floor(table: Sequence[Row], scenarios: Sequence[Scenario]) -> str:
    """The gateway against the floor (bench/support/floor_proxy.py: the same server and upstream
    client with nothing between them): what the features cost, and whether a throughput target can
    be met at all. At high concurrency the machine's cores are shared by the proxy, the load
    generator and the upstream, so the floor's req/s is the most any proxy on this stack reaches."""
    head = ["scenario", "floor CPU ms/req", "gateway CPU ms/req", "features ms/req", "floor req/s", "gateway req/s"]
    cells = []
    for scenario in scenarios:
        floor, ours = _find(table, scenario, "floor"), _find(table, scenario, "gateway")
        floor_cpu, our_cpu = _field(floor, "cpu_ms_per_req"), _field(ours, "cpu_ms_per_req")
        features = our_cpu - floor_cpu if our_cpu is not None and floor_cpu is not None else None
        row = [scenario.name, cell(floor_cpu, 3), cell(our_cpu, 3), cell(features, 3)]
        cells.append([*row, cell(_field(floor, "rps"), 0), cell(_field(ours, "rps"), 0)])
    return markdown(head, cells)
