"""Inline SVG charts for the HTML report: line charts, bars and histograms, drawn here in plain
Python so the report stays one file with no network and no plotting library at report time.

Every chart is an `<svg class="chart" id="chart-...">` whose data marks (`path.series`,
`rect.bar`, `circle.point`) sit in one `<g class="marks">`; each mark has a `<title>` tooltip.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from skyrl_agent.evaluation.curves import LABELS, PANELS, Series, present_axes
from skyrl_agent.evaluation.stats import RunSummary, pass_at_curve
from skyrl_agent.types import Trajectory

WIDTH, HEIGHT = 480, 260
LEFT, RIGHT, TOP, BOTTOM = 58, 16, 44, 46
PALETTE = ("#3b6ea8", "#d9822b", "#4c9a5b", "#b84a62")
MARKERS_UP_TO = 50
"""Points are marked on a line only when it has this many or fewer."""


def nice_ticks(lo: float, hi: float, count: int = 5, integer: bool = False) -> list[float]:
    """Round tick values covering [lo, hi], about `count` intervals (steps of 1, 2, 2.5 or 5
    times a power of ten; at least 1 when `integer`)."""
    if not hi > lo:
        lo, hi = lo - max(abs(lo) * 0.1, 0.5), hi + max(abs(hi) * 0.1, 0.5)
    raw = (hi - lo) / count
    magnitude = 10.0 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw * (1 - 1e-9))
    if integer:
        step = max(1.0, float(math.ceil(step)))
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    return [round(i * step, 12) for i in range(first, last + 1)]


def label(value: float) -> str:
    if abs(value) >= 10_000:
        return f"{value / 1000:.4g}k"
    return f"{value:.4g}"


@dataclass(frozen=True)
class _Frame:
    """Data ranges and the plot area, mapping data coordinates to SVG ones."""

    x_ticks: list[float]
    y_ticks: list[float]

    def x(self, value: float) -> float:
        lo, hi = self.x_ticks[0], self.x_ticks[-1]
        return LEFT + (value - lo) / (hi - lo) * (WIDTH - LEFT - RIGHT)

    def y(self, value: float) -> float:
        lo, hi = self.y_ticks[0], self.y_ticks[-1]
        return HEIGHT - BOTTOM - (value - lo) / (hi - lo) * (HEIGHT - TOP - BOTTOM)

    def axes(self, x_label: str, y_label: str, x_tick_labels: bool = True) -> list[str]:
        parts = []
        for tick in self.y_ticks:
            y = self.y(tick)
            parts.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" '
                         f'y2="{y:.1f}"/><text x="{LEFT - 6}" y="{y + 4:.1f}" '
                         f'text-anchor="end">{label(tick)}</text>')
        for tick in self.x_ticks if x_tick_labels else []:
            x = self.x(tick)
            parts.append(f'<line class="tick" x1="{x:.1f}" x2="{x:.1f}" y1="{HEIGHT - BOTTOM}" '
                         f'y2="{HEIGHT - BOTTOM + 4}"/><text x="{x:.1f}" '
                         f'y="{HEIGHT - BOTTOM + 16}" text-anchor="middle">{label(tick)}</text>')
        parts.append(f'<line class="axis" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{HEIGHT - BOTTOM}"'
                     f' y2="{HEIGHT - BOTTOM}"/><line class="axis" x1="{LEFT}" x2="{LEFT}" '
                     f'y1="{TOP}" y2="{HEIGHT - BOTTOM}"/>')
        parts.append(f'<text x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - 8}" '
                     f'text-anchor="middle">{escape(x_label)}</text>')
        if y_label:
            parts.append(f'<text transform="translate(14 {(TOP + HEIGHT - BOTTOM) / 2}) '
                         f'rotate(-90)" text-anchor="middle">{escape(y_label)}</text>')
        return parts


def _svg(chart_id: str, title: str, body: list[str], marks: list[str]) -> str:
    return (f'<svg class="chart" id="{escape(chart_id)}" viewBox="0 0 {WIDTH} {HEIGHT}" '
            f'width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{escape(title)}" '
            f'xmlns="http://www.w3.org/2000/svg"><text class="chart-title" x="{LEFT}" y="18">'
            f'{escape(title)}</text>{"".join(body)}<g class="marks">{"".join(marks)}</g></svg>')


def _range(values: Sequence[float], given: tuple[float, float] | None) -> tuple[float, float]:
    if given is not None:
        return min(given[0], *values), max(given[1], *values)
    return min(values), max(values)


def line_chart(chart_id: str, title: str, series: dict[str, Series], x_label: str,
               y_label: str = "", y_range: tuple[float, float] | None = None,
               integer_x: bool = False) -> str:
    """One line per named series of (x, y) points (series without points are left out)."""
    series = {name: points for name, points in series.items() if points}
    if not series:
        raise ValueError(f"chart {chart_id} has no points")
    xs = [x for points in series.values() for x, _ in points]
    ys = [y for points in series.values() for _, y in points]
    frame = _Frame(nice_ticks(*_range(xs, None), integer=integer_x),
                   nice_ticks(*_range(ys, y_range), integer=all(y.is_integer() for y in ys)))
    body = frame.axes(x_label, y_label)
    marks = []
    legend_x = LEFT
    for index, (name, points) in enumerate(series.items()):
        color = PALETTE[index % len(PALETTE)]
        path = " ".join(f"{'L' if i else 'M'}{frame.x(x):.1f} {frame.y(y):.1f}"
                        for i, (x, y) in enumerate(points))
        marks.append(f'<path class="series" d="{path}" stroke="{color}" fill="none" '
                     f'stroke-width="2"><title>{escape(name)}</title></path>')
        if len(points) <= MARKERS_UP_TO:
            marks.extend(f'<circle class="point" cx="{frame.x(x):.1f}" cy="{frame.y(y):.1f}" '
                         f'r="3" fill="{color}"><title>{escape(name)}: {label(x)}, {label(y)}'
                         f'</title></circle>' for x, y in points)
        if len(series) > 1:  # a row of swatches under the title
            body.append(f'<rect x="{legend_x}" y="{TOP - 16}" width="10" height="10" '
                        f'fill="{color}"/><text class="legend" x="{legend_x + 14}" '
                        f'y="{TOP - 7}">{escape(name)}</text>')
            legend_x += 30 + 7 * len(name)
    return _svg(chart_id, title, body, marks)


def bar_chart(chart_id: str, title: str, labels: list[str], values: list[float], x_label: str,
              y_label: str = "", y_range: tuple[float, float] | None = None) -> str:
    """One bar per label; names are written under the bars when there are few of them."""
    frame = _Frame([0.0, float(len(values))], nice_ticks(*_range([0.0, *values], y_range)))
    body = frame.axes(x_label, y_label, x_tick_labels=False)
    marks = []
    zero = frame.y(0.0)  # always in range: the bars grow from it
    for i, (name, value) in enumerate(zip(labels, values, strict=True)):
        left, right = frame.x(i + 0.1), frame.x(i + 0.9)
        top, bottom = sorted((frame.y(value), zero))
        marks.append(f'<rect class="bar" x="{left:.1f}" y="{top:.1f}" width="{right - left:.1f}"'
                     f' height="{max(bottom - top, 0.5):.1f}" fill="{PALETTE[0]}"><title>'
                     f'{escape(name)}: {label(value)}</title></rect>')
        if len(values) <= 8:
            short = name if len(name) <= 14 else name[:13] + "…"
            body.append(f'<text x="{frame.x(i + 0.5):.1f}" y="{HEIGHT - BOTTOM + 14}" '
                        f'text-anchor="middle" class="bar-label">{escape(short)}</text>')
    return _svg(chart_id, title, body, marks)


def bins(values: list[float], most: int = 20) -> list[tuple[float, float, int]]:
    """(low, high, count) bins: one per integer for integer data spanning at most `most`
    values, else up to `most` equal bins (about sqrt(len) of them); the last bin is closed."""
    lo, hi = min(values), max(values)
    if all(float(v).is_integer() for v in values) and hi - lo < most:
        edges = [lo - 0.5 + i for i in range(int(hi - lo) + 2)]
    elif hi == lo:
        edges = [lo - 0.5, hi + 0.5]
    else:
        count = min(most, max(1, math.ceil(math.sqrt(len(values)))))
        edges = [lo + (hi - lo) * i / count for i in range(count + 1)]
    counts = [0] * (len(edges) - 1)
    for value in values:
        index = next((i for i in range(len(counts)) if value < edges[i + 1]), len(counts) - 1)
        counts[index] += 1
    return [(edges[i], edges[i + 1], counts[i]) for i in range(len(counts))]


def histogram(chart_id: str, title: str, values: list[float], x_label: str) -> str:
    binned = bins(values)
    integral = all(float(v).is_integer() for v in values)
    frame = _Frame(nice_ticks(binned[0][0], binned[-1][1], integer=integral),
                   nice_ticks(0, max(c for _, _, c in binned), integer=True))
    body = frame.axes(x_label, "trajectories")
    marks = []
    for low, high, count in binned:
        left, right = frame.x(low), frame.x(high)
        marks.append(f'<rect class="bar" x="{left + 1:.1f}" y="{frame.y(count):.1f}" '
                     f'width="{max(right - left - 2, 1):.1f}" '
                     f'height="{max(frame.y(0) - frame.y(count), 0.5):.1f}" fill="{PALETTE[1]}">'
                     f'<title>{label(low)} to {label(high)}: {count}</title></rect>')
    return _svg(chart_id, title, body, marks)


def sampled_tokens(trajectory: Trajectory) -> int:
    return sum(len(turn.completion_ids) for s in trajectory.segments for turn in s.turns)


def run_charts(summary: RunSummary, trajectories: list[Trajectory]) -> list[str]:
    """pass@k for k = 1..n, mean reward per task, turns and sampled tokens per trajectory, and
    the mean time account (when any time was recorded)."""
    charts = []
    curve = pass_at_curve(summary)
    if curve:
        charts.append(line_chart("chart-pass-at-k", "pass@k", {"pass@k": list(curve.items())},
                                 "k (samples per task)", "pass@k", (0.0, 1.0), integer_x=True))
    rows = summary.per_task
    charts.append(bar_chart("chart-task-reward", "Mean reward per task",
                            [r.task_id for r in rows], [r.reward_mean for r in rows],
                            f"{len(rows)} tasks (hover a bar for its name)", "reward mean",
                            (0.0, 1.0)))
    charts.append(histogram("chart-turns", "Turns per trajectory",
                            [float(t.num_turns) for t in trajectories], "turns"))
    charts.append(histogram("chart-tokens", "Sampled tokens per trajectory",
                            [float(sampled_tokens(t)) for t in trajectories], "sampled tokens"))
    account = summary.time_account
    if sum(account.values()) > 0:
        charts.append(bar_chart("chart-time-account", "Where a trajectory's time went",
                                list(account), list(account.values()),
                                "time account bucket", "mean seconds"))
    return charts


def training_charts(series: dict[str, Series]) -> list[str]:
    """One line chart per group of metrics the run logged (see curves.PANELS)."""
    charts = []
    for panel in PANELS:
        for keys in present_axes(panel, series):
            names = [LABELS.get(key, key) for key in keys]
            chart_id = "chart-train-" + keys[0].replace("_", "-").replace("/", "-")
            title = " and ".join(names)
            charts.append(line_chart(chart_id, title[0].upper() + title[1:],
                                     {name: series[key] for name, key in zip(names, keys,
                                                                             strict=True)},
                                     "step", integer_x=True))
    return charts
