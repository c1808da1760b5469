"""Inline SVG charts for the HTML report: line charts (CDFs, throughput over
time) and grouped bar charts (histograms). No dependency, no external asset:
each function returns one `<svg>` element as a string, text escaped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

PALETTE = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#ff7f0e",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#7f7f7f",
)
WIDTH, HEIGHT = 560, 300
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 58, 16, 30, 62


@dataclass(slots=True)
class Series:
    name: str
    xs: list[float]
    ys: list[float]
    color: str = PALETTE[0]


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high]."""
    if high <= low:
        high = low + 1.0
    raw_step = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw_step))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw_step)
    first = math.floor(low / step) * step
    return [
        first + i * step
        for i in range(int((high - first) / step) + 2)
        if first + i * step <= high + step * 1e-9
    ]


def _format_tick(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:.0f}"
    return f"{value:.3g}"


@dataclass(slots=True)
class Band:
    """A labelled span of the x axis (e.g. the time a scenario ran)."""

    start: float
    end: float
    label: str


@dataclass(slots=True)
class _Frame:
    x_low: float
    x_high: float
    y_low: float
    y_high: float

    def x(self, value: float) -> float:
        span = (self.x_high - self.x_low) or 1.0
        return MARGIN_LEFT + (value - self.x_low) / span * (WIDTH - MARGIN_LEFT - MARGIN_RIGHT)

    def y(self, value: float) -> float:
        span = (self.y_high - self.y_low) or 1.0
        return (
            HEIGHT
            - MARGIN_BOTTOM
            - (value - self.y_low) / span * (HEIGHT - MARGIN_TOP - MARGIN_BOTTOM)
        )


def _axes(
    frame: _Frame, title: str, x_label: str, y_label: str, x_ticks: list[float] | None
) -> list[str]:
    parts = [
        f'<text x="{WIDTH / 2}" y="18" text-anchor="middle" font-size="14" font-weight="bold">{escape(title)}</text>',
        f'<text x="{WIDTH / 2}" y="{HEIGHT - 26}" text-anchor="middle" font-size="12">{escape(x_label)}</text>',
        f'<text x="14" y="{HEIGHT / 2}" text-anchor="middle" font-size="12" '
        f'transform="rotate(-90 14 {HEIGHT / 2})">{escape(y_label)}</text>',
    ]
    for tick in nice_ticks(frame.y_low, frame.y_high):
        y = frame.y(tick)
        parts.append(
            f'<line x1="{MARGIN_LEFT}" x2="{WIDTH - MARGIN_RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e4e4e4"/>'
        )
        parts.append(
            f'<text x="{MARGIN_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="10">{_format_tick(tick)}</text>'
        )
    for tick in x_ticks if x_ticks is not None else nice_ticks(frame.x_low, frame.x_high):
        x = frame.x(tick)
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{HEIGHT - MARGIN_BOTTOM}" y2="{HEIGHT - MARGIN_BOTTOM + 4}" stroke="#444"/>'
        )
        parts.append(
            f'<text x="{x:.1f}" y="{HEIGHT - MARGIN_BOTTOM + 16}" text-anchor="middle" font-size="10">{_format_tick(tick)}</text>'
        )
    bottom, right = HEIGHT - MARGIN_BOTTOM, WIDTH - MARGIN_RIGHT
    parts.append(
        f'<polyline points="{MARGIN_LEFT},{MARGIN_TOP} {MARGIN_LEFT},{bottom} {right},{bottom}" fill="none" stroke="#444"/>'
    )
    return parts


def _legend(series: list[Series]) -> list[str]:
    parts, x = [], MARGIN_LEFT
    for item in series:
        y = HEIGHT - 8
        parts.append(f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="{item.color}"/>')
        parts.append(f'<text x="{x + 14}" y="{y}" font-size="11">{escape(item.name)}</text>')
        x += 24 + 7 * len(item.name)
    return parts


def _wrap(parts: list[str], title: str) -> str:
    body = "\n".join(parts)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}" '
        f'font-family="sans-serif">\n{body}\n</svg>'
    )


def _empty(title: str) -> str:
    message = (
        f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" font-size="12">no data</text>'
    )
    return _wrap(
        [
            f'<text x="{WIDTH / 2}" y="18" text-anchor="middle" font-size="14">{escape(title)}</text>',
            message,
        ],
        title,
    )


def line_chart(
    title: str,
    series: list[Series],
    x_label: str,
    y_label: str,
    *,
    is_step: bool = False,
    bands: list[Band] | None = None,
) -> str:
    """One polyline per series over shared axes (a step line for CDFs), over shaded bands."""
    drawn = [item for item in series if item.xs]
    if not drawn:
        return _empty(title)
    frame = _Frame(
        min(0.0, min(min(s.xs) for s in drawn)),
        max(max(s.xs) for s in drawn),
        min(0.0, min(min(s.ys) for s in drawn)),
        max(max(s.ys) for s in drawn) * 1.05 or 1.0,
    )
    parts = _bands(frame, bands or []) + _axes(frame, title, x_label, y_label, None)
    for item in drawn:
        points = _step_points(item) if is_step else list(zip(item.xs, item.ys, strict=True))
        coordinates = " ".join(f"{frame.x(x):.1f},{frame.y(y):.1f}" for x, y in points)
        parts.append(
            f'<polyline points="{coordinates}" fill="none" stroke="{item.color}" stroke-width="1.8"/>'
        )
    return _wrap(parts + _legend(drawn), title)


def _bands(frame: _Frame, bands: list[Band]) -> list[str]:
    parts = []
    for number, band in enumerate(bands):
        left, right = frame.x(band.start), frame.x(band.end)
        shade = "#f3f6fb" if number % 2 == 0 else "#fbf8f1"
        height = HEIGHT - MARGIN_TOP - MARGIN_BOTTOM
        parts.append(
            f'<rect x="{left:.1f}" y="{MARGIN_TOP}" width="{max(right - left, 0.5):.1f}" height="{height}" fill="{shade}"/>'
        )
        label_y = MARGIN_TOP + 10 + (number % 3) * 11
        parts.append(
            f'<text x="{left + 2:.1f}" y="{label_y}" font-size="9" fill="#777">{escape(band.label)}</text>'
        )
    return parts


def _step_points(series: Series) -> list[tuple[float, float]]:
    points, previous_y = [], 0.0
    for x, y in zip(series.xs, series.ys, strict=True):
        points += [(x, previous_y), (x, y)]
        previous_y = y
    return points


def bar_chart(
    title: str, categories: list[str], series: list[Series], x_label: str, y_label: str
) -> str:
    """Grouped bars: one group per category, one bar per series (ys align with categories)."""
    if not categories or not series:
        return _empty(title)
    top = max((max(item.ys, default=0.0) for item in series), default=0.0) * 1.05 or 1.0
    frame = _Frame(0.0, float(len(categories)), 0.0, top)
    parts = _axes(frame, title, x_label, y_label, [])
    group_width = (WIDTH - MARGIN_LEFT - MARGIN_RIGHT) / len(categories)
    bar_width = group_width * 0.8 / len(series)
    for position, category in enumerate(categories):
        left = frame.x(position) + group_width * 0.1
        for number, item in enumerate(series):
            value = item.ys[position]
            y = frame.y(value)
            parts.append(
                f'<rect x="{left + number * bar_width:.1f}" y="{y:.1f}" width="{bar_width:.1f}" '
                f'height="{HEIGHT - MARGIN_BOTTOM - y:.1f}" fill="{item.color}"><title>{escape(item.name)}: '
                f"{escape(category)} → {value:g}</title></rect>"
            )
        label_x = frame.x(position) + group_width / 2
        parts.append(
            f'<text x="{label_x:.1f}" y="{HEIGHT - MARGIN_BOTTOM + 16}" text-anchor="middle" font-size="10">{escape(category)}</text>'
        )
    return _wrap(parts + _legend(series), title)
