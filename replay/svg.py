"""Minimal SVG charts (CDF, scatter over time, horizontal bars) drawn by hand.

The HTML report must open anywhere, offline and without scripts, so the charts are plain inline
SVG built from strings here rather than by a plotting library.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import TypeVar

_T = TypeVar("_T")

# Enough points for a smooth curve; more only makes the file bigger.
MAX_CURVE_POINTS = 400
MAX_SCATTER_POINTS = 4000
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b")
FAILURE_COLOR = "#d62728"


@dataclass(frozen=True, slots=True)
class Frame:
    """Maps data coordinates onto the plot area of a `width` x `height` SVG."""

    x_range: tuple[float, float]
    y_range: tuple[float, float]
    width: int = 520
    height: int = 300
    left: int = 64
    right: int = 20
    top: int = 28
    bottom: int = 44

    def x(self, value: float) -> float:
        low, high = self.x_range
        span = high - low or 1.0
        return self.left + (value - low) / span * (self.width - self.left - self.right)

    def y(self, value: float) -> float:
        low, high = self.y_range
        span = high - low or 1.0
        return self.height - self.bottom - (value - low) / span * (self.height - self.top - self.bottom)


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten) from at or below `low` to at or above
    `high`; a chart's axis spans the first to the last, so it ends on a labelled value."""
    if high <= low:
        high = low + 1.0
    raw = (high - low) / max(1, count)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first, last = math.floor(low / step), math.ceil(high / step - 1e-9)
    # Rounded so that 3 x 0.2 prints as 0.6, not 0.6000000000000001.
    return [round(n * step, 12) for n in range(first, last + 1)]


def span(values: Sequence[float]) -> tuple[float, float]:
    """An axis range from zero to the first round tick at or above the largest value."""
    ticks = nice_ticks(0.0, max(values, default=1.0) or 1.0)
    return ticks[0], ticks[-1]


def _label(value: float) -> str:
    return f"{value:g}" if abs(value) >= 0.01 or value == 0 else f"{value:.1e}"


def axes(frame: Frame, x_label: str, y_label: str) -> list[str]:
    parts = []
    for tick in nice_ticks(*frame.x_range):
        x = frame.x(tick)
        parts.append(
            f'<line x1="{x:.1f}" y1="{frame.top}" x2="{x:.1f}" y2="{frame.height - frame.bottom}" '
            f'stroke="#eee"/><text x="{x:.1f}" y="{frame.height - frame.bottom + 16}" '
            f'text-anchor="middle">{_label(tick)}</text>'
        )
    for tick in nice_ticks(*frame.y_range):
        y = frame.y(tick)
        parts.append(
            f'<line x1="{frame.left}" y1="{y:.1f}" x2="{frame.width - frame.right}" y2="{y:.1f}" '
            f'stroke="#eee"/><text x="{frame.left - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"{_label(tick)}</text>"
        )
    bottom = frame.height - frame.bottom
    parts.append(
        f'<polyline points="{frame.left},{frame.top} {frame.left},{bottom} '
        f'{frame.width - frame.right},{bottom}" fill="none" stroke="#333"/>'
    )
    parts.append(
        f'<text x="{(frame.left + frame.width - frame.right) / 2}" y="{frame.height - 8}" '
        f'text-anchor="middle">{escape(x_label)}</text>'
    )
    parts.append(
        f'<text transform="translate(14 {(frame.top + bottom) / 2}) rotate(-90)" '
        f'text-anchor="middle">{escape(y_label)}</text>'
    )
    return parts


def document(frame: Frame, title: str, body: Sequence[str]) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {frame.width} {frame.height}" '
        f'width="{frame.width}" height="{frame.height}" font-family="sans-serif" font-size="11" role="img">'
        f"<title>{escape(title)}</title>"
        f'<text x="{frame.left}" y="16" font-size="13" font-weight="bold">{escape(title)}</text>'
        + "".join(body)
        + "</svg>"
    )


def _thin(values: Sequence[_T], limit: int) -> list[_T]:
    """At most `limit` evenly spaced elements, always keeping the last."""
    if len(values) <= limit:
        return list(values)
    step = len(values) / limit
    return [values[int(i * step)] for i in range(limit)] + [values[-1]]


def cdf_chart(title: str, series: Sequence[tuple[str, Sequence[float]]], x_label: str) -> str:
    """Empirical CDFs (step curves) of one or more samples, x in the data's unit."""
    present = [(name, sorted(values)) for name, values in series if values]
    frame = Frame(span([values[-1] for _, values in present]), (0.0, 1.0))
    body = axes(frame, x_label, "share of requests <= x")
    for n, (name, values) in enumerate(present):
        color = PALETTE[n % len(PALETTE)]
        count = len(values)
        points = _thin([(v, (i + 1) / count) for i, v in enumerate(values)], MAX_CURVE_POINTS)
        coords = " ".join(f"{frame.x(x):.1f},{frame.y(y):.1f}" for x, y in points)
        body.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="1.8"/>')
        # Top left: a CDF climbs towards the top right, so that corner is where the curve is not.
        body.append(
            f'<text x="{frame.left + 6}" y="{frame.top + 14 + 14 * n}" fill="{color}">{escape(name)} (n={count})</text>'
        )
    if not present:
        body.append(f'<text x="{frame.width / 2}" y="{frame.height / 2}" text-anchor="middle">no data</text>')
    return document(frame, title, body)


def scatter_chart(
    title: str, series: Sequence[tuple[str, Sequence[tuple[float, float]]]], x_label: str, y_label: str
) -> str:
    """Points over time; a series named 'failed' is drawn as red crosses."""
    every = [point for _, points in series for point in points]
    frame = Frame(span([x for x, _ in every]), span([y for _, y in every]))
    body = axes(frame, x_label, y_label)
    for n, (name, points) in enumerate(series):
        color = FAILURE_COLOR if name == "failed" else PALETTE[n % len(PALETTE)]
        for x, y in _thin(points, MAX_SCATTER_POINTS):
            cx, cy = frame.x(x), frame.y(y)
            if name == "failed":
                body.append(f'<path d="M{cx - 3:.1f} {cy - 3:.1f}l6 6m0 -6l-6 6" stroke="{color}"/>')
            else:
                body.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="2" fill="{color}" fill-opacity="0.6"/>')
        body.append(
            f'<text x="{frame.width - frame.right - 4}" y="{frame.top + 14 + 14 * n}" text-anchor="end" '
            f'fill="{color}">{escape(name)} ({len(points)})</text>'
        )
    return document(frame, title, body)


def bar_chart(title: str, bars: Sequence[tuple[str, int, bool]]) -> str:
    """Horizontal bars `(label, count, counts as failure)`; non-failures are drawn grey."""
    height = max(80, 40 + 22 * len(bars))
    frame = Frame(
        (0.0, float(max((count for _, count, _ in bars), default=1))),
        (0.0, 1.0),
        height=height,
        left=180,
        right=40,
        bottom=16,
    )
    body = []
    for n, (label, count, failure) in enumerate(bars):
        y = frame.top + 22 * n
        width = frame.x(count) - frame.left
        color = FAILURE_COLOR if failure else "#999"
        body.append(
            f'<text x="{frame.left - 6}" y="{y + 13}" text-anchor="end">{escape(label)}</text>'
            f'<rect x="{frame.left}" y="{y}" width="{width:.1f}" height="16" fill="{color}"/>'
            f'<text x="{frame.left + width + 4:.1f}" y="{y + 13}">{count}</text>'
        )
    if not bars:
        body.append(f'<text x="{frame.left}" y="{frame.top + 16}">no failures</text>')
    return document(frame, title, body)
