"""Training curves of a run dir: PNGs in `RUN_DIR/curves/` from its `metrics.jsonl`.

The same panels (which metrics are drawn together) feed the SVG charts of the HTML report.
matplotlib is imported only when PNGs are drawn, so importing this module stays cheap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Series = list[tuple[float, float]]
"""(step, value) points in step order."""


@dataclass(frozen=True)
class Panel:
    """One picture: `axes` are groups of metric keys drawn on a shared y axis each."""

    name: str
    title: str
    axes: tuple[tuple[str, ...], ...]


PANELS = (
    Panel("reward", "Reward and pass rate", (("reward_mean", "pass_rate"),)),
    Panel("loss", "Loss and gradient norm", (("loss",), ("grad_norm",))),
    Panel("staleness", "Staleness (max) and dropped groups",
          (("staleness_max", "dropped_stale"),)),
    Panel("throughput", "Trainer idle fraction and sampled tokens/s",
          (("trainer_idle",), ("sampled_tokens_per_s",))),
)

LABELS = {"reward_mean": "reward mean", "pass_rate": "pass rate", "loss": "loss",
          "grad_norm": "grad norm", "staleness_max": "staleness max",
          "dropped_stale": "dropped (stale)", "trainer_idle": "trainer idle fraction",
          "sampled_tokens_per_s": "sampled tokens/s"}


def metric_series(rows: list[dict[str, Any]]) -> dict[str, Series]:
    """Every numeric metric as (step, value) points. A step logged twice (a resumed run redoing
    it) keeps its last line; values that are not finite numbers are left out."""
    by_step: dict[int, dict[str, Any]] = {}
    for row in rows:
        step = row.get("step")
        if isinstance(step, int | float) and not isinstance(step, bool) and math.isfinite(step):
            by_step[int(step)] = row
    series: dict[str, Series] = {}
    for step in sorted(by_step):
        for key, value in by_step[step].items():
            if key == "step" or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if math.isfinite(value):
                series.setdefault(key, []).append((float(step), float(value)))
    return series


def present_axes(panel: Panel, series: dict[str, Series]) -> list[tuple[str, ...]]:
    """The panel's axes restricted to the keys the run has; axes left empty are dropped."""
    axes = [tuple(key for key in keys if series.get(key)) for keys in panel.axes]
    return [keys for keys in axes if keys]


def training_series(run_dir: Path) -> dict[str, Series]:
    """The run's per-step metrics (empty when it has no metrics.jsonl: not a training run)."""
    from skyrl_agent.rl.metrics import read_metrics

    if not (Path(run_dir) / "metrics.jsonl").is_file():
        return {}  # not a training run: skip importing the trainer
    return metric_series(read_metrics(run_dir))


def write_curves(run_dir: Path) -> list[Path]:
    """Draw `RUN_DIR/curves/<panel>.png` for each panel the run has metrics for; returns the
    written paths (none when the run has no metrics.jsonl)."""
    series = training_series(run_dir)
    drawn = [(panel, axes) for panel in PANELS if (axes := present_axes(panel, series))]
    if not drawn:
        return []
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # no display, no pyplot state
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    folder = Path(run_dir) / "curves"
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for panel, axes in drawn:
        figure = Figure(figsize=(6.4, 2.8 * len(axes)), layout="constrained")
        FigureCanvasAgg(figure)
        figure.suptitle(panel.title)
        for plot, keys in zip(figure.subplots(len(axes), 1, squeeze=False)[:, 0], axes,
                              strict=True):
            for key in keys:
                steps, values = zip(*series[key], strict=True)
                plot.plot(steps, values, marker="o" if len(steps) <= 50 else None,
                          markersize=3, label=LABELS.get(key, key))
            plot.set_xlabel("step")
            plot.xaxis.set_major_locator(MaxNLocator(integer=True))
            if all(value.is_integer() for key in keys for _, value in series[key]):
                plot.yaxis.set_major_locator(MaxNLocator(integer=True))  # counts
            plot.grid(alpha=0.3)
            plot.legend(loc="best", fontsize="small")
        path = folder / f"{panel.name}.png"
        figure.savefig(path, dpi=100)
        written.append(path)
    return written
