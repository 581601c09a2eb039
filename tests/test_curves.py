"""Pictures of a run: training-curve PNGs, the SVG charts of the report and their helpers."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from skyrl_agent.evaluation.charts import bins, histogram, line_chart, nice_ticks, training_charts
from skyrl_agent.evaluation.curves import metric_series, training_series, write_curves
from skyrl_agent.evaluation.stats import pass_at_curve, pass_at_k, summarize
from tests.test_store import make_trajectory

PNG = b"\x89PNG\r\n\x1a\n"


def write_metrics(run_dir: Path, steps: int = 6, missing: tuple[str, ...] = ()) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for step in range(steps):
        row = {"step": step, "reward_mean": 0.2 + 0.1 * step, "pass_rate": 0.1 * step,
               "loss": 1.0 / (step + 1), "grad_norm": 2.0 + math.sin(step),
               "agreement/max_abs_diff": 1e-7, "staleness_max": step % 3,
               "dropped_stale": step % 2, "trainer_idle": 0.25,
               "sampled_tokens_per_s": 1000.0 + 50 * step}
        lines.append(json.dumps({k: v for k, v in row.items() if k not in missing}))
    lines.append('{"step": 99, "loss"')  # a torn last line, as a crash leaves it
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG, f"{path.name} is not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")  # IHDR


def test_write_curves_draws_each_panel_and_skips_missing_keys(tmp_path):
    write_metrics(tmp_path, missing=("grad_norm", "trainer_idle"))
    paths = write_curves(tmp_path)
    assert [p.name for p in paths] == ["reward.png", "loss.png", "staleness.png",
                                       "throughput.png"]
    assert all(p.parent == tmp_path / "curves" and p.stat().st_size > 5000 for p in paths)
    sizes = {p.stem: png_size(p) for p in paths}
    # One axes each: loss without grad_norm, throughput without trainer_idle.
    assert len(set(sizes.values())) == 1 and sizes["loss"] == (640, 280)
    write_metrics(tmp_path / "full")
    full = {p.stem: png_size(p) for p in write_curves(tmp_path / "full")}
    assert full["loss"] == (640, 560) and full["throughput"] == (640, 560)
    assert full["reward"] == (640, 280)


def test_write_curves_skips_panels_the_run_lacks(tmp_path):
    only = ("pass_rate", "loss", "grad_norm", "staleness_max", "dropped_stale",
            "trainer_idle", "sampled_tokens_per_s", "agreement/max_abs_diff")
    write_metrics(tmp_path, missing=only)
    assert [p.name for p in write_curves(tmp_path)] == ["reward.png"]
    assert [p.name for p in (tmp_path / "curves").iterdir()] == ["reward.png"]
    assert write_curves(tmp_path / "rollout") == []  # no metrics.jsonl: not a training run
    assert not (tmp_path / "rollout" / "curves").exists()


def test_curves_draw_the_values(tmp_path):
    """The pixels follow the data: a rising reward line (matplotlib's first colour, #1f77b4)
    is drawn higher on the right than on the left; a falling one lower."""
    import numpy as np
    from matplotlib.image import imread

    def blue_rows(rewards: list[float]) -> tuple[float, float]:
        run = tmp_path / str(len(rewards))
        run.mkdir()
        (run / "metrics.jsonl").write_text("".join(
            json.dumps({"step": s, "reward_mean": r}) + "\n" for s, r in enumerate(rewards)))
        image = imread(write_curves(run)[0])[:, :, :3]
        rows, cols = np.nonzero(np.abs(image - [0.122, 0.467, 0.706]).max(axis=2) < 0.05)
        assert len(rows) > 200, "no line drawn"
        third = image.shape[1] / 3
        return rows[cols < third].mean(), rows[cols > 2 * third].mean()

    left, right = blue_rows([0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    assert right < left - 50  # image rows grow downwards
    left, right = blue_rows([1.0, 0.8, 0.6, 0.4, 0.2, 0.0, 0.0])
    assert right > left + 50


def test_importing_curves_stays_cheap():
    code = ("import sys, skyrl_agent.evaluation.curves, skyrl_agent.evaluation.charts; "
            "print(sorted(m for m in ('matplotlib', 'torch') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.stdout.strip() == "[]", result.stderr


def test_metric_series_keeps_the_last_line_of_a_step_and_finite_numbers():
    rows = [{"step": 0, "loss": 1.0, "note": "x", "flag": True},
            {"step": 1, "loss": float("nan"), "reward_mean": 0.5},
            {"step": 0, "loss": 0.5},  # step 0 again, after a resume: the later line wins
            {"loss": 9.0}, {"step": 2, "loss": float("inf"), "reward_mean": 1}]
    assert metric_series(rows) == {"loss": [(0.0, 0.5)],
                                   "reward_mean": [(1.0, 0.5), (2.0, 1.0)]}


def test_training_series_reads_metrics_jsonl(tmp_path):
    write_metrics(tmp_path, steps=3)
    series = training_series(tmp_path)
    assert series["loss"] == [(0.0, 1.0), (1.0, 0.5), (2.0, pytest.approx(1 / 3))]
    assert training_series(tmp_path / "none") == {}


def test_pass_at_curve_goes_through_every_k():
    runs = [make_trajectory("demo/a", i, r) for i, r in enumerate([1, 0, 0, 1, 0])]
    runs += [make_trajectory("demo/b", i, r) for i, r in enumerate([0, 0, 0, 0, 1])]
    curve = pass_at_curve(summarize(runs))
    assert list(curve) == [1, 2, 3, 4, 5]
    for k, value in curve.items():
        assert value == pytest.approx((pass_at_k(5, 2, k) + pass_at_k(5, 1, k)) / 2)
    assert summarize(runs).pass_at == {k: curve[k] for k in (1, 2, 4, 5)}


def test_nice_ticks_and_bins():
    assert nice_ticks(0, 1) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(0.13, 0.91) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(1, 3, integer=True) == [1, 2, 3]
    assert nice_ticks(3, 3, integer=True) == [2, 3, 4]  # one value: a range around it
    assert nice_ticks(0, 12345)[-1] >= 12345 and len(nice_ticks(0, 12345)) <= 7
    assert bins([3, 3, 4, 6]) == [(2.5, 3.5, 2), (3.5, 4.5, 1), (4.5, 5.5, 0), (5.5, 6.5, 1)]
    spread = bins([0.0, 10.0, 100.0, 1000.0])
    assert len(spread) == 2 and [c for _, _, c in spread] == [3, 1]
    assert spread[0][0] == 0.0 and spread[-1][1] == 1000.0  # the maximum is in the last bin
    assert bins([7.5, 7.5]) == [(7.0, 8.0, 2)]


def test_svg_charts_scale_the_data_into_the_plot():
    svg = line_chart("chart-x", "x <y>", {"a": [(0, 0.0), (4, 1.0)]}, "step", y_range=(0, 1))
    assert 'id="chart-x"' in svg and "x &lt;y&gt;" in svg
    # x 0..4 -> LEFT..WIDTH-RIGHT (58..464); y 0..1 -> HEIGHT-BOTTOM..TOP (214..44).
    assert 'd="M58.0 214.0 L464.0 44.0"' in svg
    assert svg.count('class="point"') == 2
    bars = histogram("chart-h", "h", [1, 1, 2], "turns")
    assert bars.count('class="bar"') == 2 and ": 2</title>" in bars
    with pytest.raises(ValueError):
        line_chart("chart-empty", "empty", {"a": []}, "step")


def test_training_charts_follow_the_metrics_present():
    rows = [{"step": s, "reward_mean": 0.1 * s, "loss": 1.0, "staleness_max": 0}
            for s in range(3)]
    charts = training_charts(metric_series(rows))
    ids = [c.split('id="', 1)[1].split('"', 1)[0] for c in charts]
    assert ids == ["chart-train-reward-mean", "chart-train-loss", "chart-train-staleness-max"]
    assert training_charts({}) == []
