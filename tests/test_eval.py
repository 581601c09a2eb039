"""`skyrl-agent eval`: pass@k, per-task stats, HTML report and its charts in Chromium,
re-grading, bad input."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from math import comb
from pathlib import Path

import pytest

from skyrl_agent.data.run_dir import RunDir
from skyrl_agent.data.store import TrajectoryStore
from skyrl_agent.evaluation.hacks import hack_report
from skyrl_agent.evaluation.stats import describe_time, pass_at_curve, pass_at_k, summarize
from skyrl_agent.tasks.spec import TWIN_SUFFIX
from tests.test_html_report import dump_dom
from tests.test_store import make_trajectory

CLI = [sys.executable, "-c", "from skyrl_agent.cli import main; main()"]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600)


def test_pass_at_k_matches_the_closed_form():
    # 5 samples, 2 passing: pass@1 = 2/5; pass@2 = 1 - C(3,2)/C(5,2) = 1 - 3/10.
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 3, 3) == 1.0  # n - c < k: always a pass
    for n, c, k in [(10, 3, 4), (16, 5, 8), (7, 1, 7)]:
        # The probability that k samples drawn without replacement include a pass.
        assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k))
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_summary_of_a_constructed_run():
    runs = [make_trajectory("demo/a", i, reward) for i, reward in enumerate([1, 0, 1, 0])]
    runs += [make_trajectory("demo/b", i, reward) for i, reward in enumerate([0, 0, 0, 1])]
    summary = summarize(runs)
    assert summary.pass_at[1] == pytest.approx((0.5 + 0.25) / 2)
    assert summary.pass_at[2] == pytest.approx(((1 - 1 / 6) + (1 - 3 / 6)) / 2)
    assert summary.pass_at[4] == 1.0
    assert [(r.task_id, r.passed) for r in summary.per_task] == [("demo/a", 2), ("demo/b", 1)]
    assert summary.turns_mean == 3 and summary.finish_reasons == {"stop": 8}


def test_the_time_account_is_a_mean_per_bucket_described_by_its_share():
    first = dataclasses.replace(make_trajectory("t/a", 0, 1.0), sandbox_time_s=1.0,
                                model_time_s=2.0, total_time_s=4.0)
    second = dataclasses.replace(make_trajectory("t/a", 1, 0.0), sandbox_time_s=3.0,
                                 exec_time_s=1.0, verify_time_s=0.5, total_time_s=4.5)
    account = summarize([first, second]).time_account
    assert account == {"sandbox": 2.0, "model": 1.0, "exec": 0.5, "framework": 0.5,
                       "handover": 0.0, "collect": 0.0, "verify": 0.25, "stop": 0.0}
    # framework: 4 - 1 - 2 = 1 for the first, 4.5 - 3 - 1 - 0.5 = 0 for the second.
    line = describe_time(account)
    assert line.split(" · ")[:4] == ["sandbox 2.00s (47%)", "model 1.00s (24%)",
                                     "exec 0.50s (12%)", "framework 0.50s (12%)"]
    assert line.endswith("verify 0.25s (6%) · stop 0.00s (0%)")
    assert describe_time(summarize([make_trajectory("t/a", 0, 1.0)]).time_account) == \
        "no time recorded"


def masked(trajectory):
    return dataclasses.replace(trajectory, masked=True, mask_reason="agent timeout")


def test_impossible_twins_are_counted_apart():
    """Samples of impossible twins give the twin rate (rewarded ones over unmasked ones) and
    touch no other number: a forged reward on a twin must not raise the run's reward."""
    twin = "swe/a" + TWIN_SUFFIX
    runs = [make_trajectory("swe/a", 0, 0.0), make_trajectory("swe/a", 1, 1.0),
            make_trajectory(twin, 2, 1.0), make_trajectory(twin, 3, 0.0),
            make_trajectory(twin, 4, 1.0), masked(make_trajectory(twin, 5, 1.0))]
    summary = summarize(runs)
    assert (summary.impossible_twins, summary.impossible_twin_rate) == (3, pytest.approx(2 / 3))
    assert (summary.trajectories, summary.tasks, summary.reward_mean) == (2, 1, 0.5)
    assert summary.masked == 0 and summary.pass_at[1] == 0.5
    assert summarize(runs[:2]).impossible_twins == 0
    report = hack_report(runs, None)
    assert [(f.task_id, f.reasons) for f in report.flagged] == [
        (twin, ("a reward on an impossible twin",))] * 2


def test_pass_at_k_leaves_masked_samples_out():
    """Stops: counting masked samples as failures. A masked sample carries no verdict: pass@k
    is estimated from the unmasked ones (n = samples - masked), and k only goes as far as the
    fewest unmasked samples of any task."""
    runs = [make_trajectory("demo/a", i, reward) for i, reward in enumerate([1, 0, 1])]
    runs.append(masked(make_trajectory("demo/a", 3, 0)))
    runs += [make_trajectory("demo/b", i, reward) for i, reward in enumerate([1, 0, 0])]
    runs.append(masked(make_trajectory("demo/b", 3, 0)))
    summary = summarize(runs)
    assert set(summary.pass_at) == {1, 2, 3}
    assert summary.pass_at[1] == pytest.approx((2 / 3 + 1 / 3) / 2)
    assert summary.pass_at[2] == pytest.approx((1.0 + (1 - 1 / 3)) / 2)
    assert [(r.samples, r.masked, r.passed) for r in summary.per_task] == [(4, 1, 2), (4, 1, 1)]
    assert summary.masked == 2 and summary.reward_mean == pytest.approx(3 / 6)


def test_pass_at_k_averages_the_tasks_with_enough_unmasked_samples():
    """Stops: one task with few (or no) unmasked samples hiding pass@k for the whole run, and
    pass@k averaging in a task that has fewer than k unmasked samples. With 4 unmasked samples
    of one task, 2 of another, 2 of a third and none of a fourth, pass@1 and pass@2 are over
    three tasks, pass@4 over one, and the fully masked task is counted as left out."""
    runs = [make_trajectory("demo/a", i, reward) for i, reward in enumerate([1, 0, 0, 0])]
    runs += [make_trajectory("demo/b", i, reward) for i, reward in enumerate([0, 1])]
    runs += [masked(make_trajectory("demo/c", i, 0)) for i in range(3)]
    runs += [make_trajectory("demo/c", 3 + i, reward) for i, reward in enumerate([0, 0])]
    runs += [masked(make_trajectory("demo/d", i, 1)) for i in range(2)]
    summary = summarize(runs)
    assert set(summary.pass_at) == {1, 2, 4}
    assert summary.pass_at[1] == pytest.approx((1 / 4 + 1 / 2 + 0) / 3)
    assert summary.pass_at[2] == pytest.approx((1 / 2 + 1 + 0) / 3)
    assert summary.pass_at[4] == 1.0
    assert summary.pass_at_tasks == {1: 3, 2: 3, 4: 1} and summary.unscored_tasks == 1
    assert pass_at_curve(summary) == pytest.approx({1: summary.pass_at[1],
                                                    2: summary.pass_at[2], 3: 1 - 1 / 4,
                                                    4: 1.0})
    nothing = summarize([masked(make_trajectory("demo/a", 0))])
    assert nothing.pass_at == {} and nothing.unscored_tasks == 1


def write_run(run_dir: Path, count: int) -> None:
    store = TrajectoryStore(run_dir, writable=True)
    store.append([make_trajectory(f"demo/t{i % 2}", i) for i in range(count)])
    store.close()
    config = {"n": 1, "config": {"inference": {"model": "smollm2-135m"}}}
    (run_dir / "config.json").write_text(json.dumps(config))


def write_training_metrics(run_dir: Path, steps: int = 4) -> None:
    """A training run's metrics.jsonl, without grad_norm (a run may lack some keys)."""
    rows = [{"step": s, "reward_mean": 0.25 * s, "pass_rate": 0.2 * s, "loss": 1 / (s + 1),
             "staleness_max": s % 2, "dropped_stale": 0, "trainer_idle": 0.5,
             "sampled_tokens_per_s": 100.0 * s} for s in range(steps)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


class _Count(HTMLParser):
    """Classes, the body's data-* markers and, per chart (svg.chart), its marks: series paths
    with a non-empty d, bars, points, and whether the page's script saw it laid out."""

    def __init__(self) -> None:
        super().__init__()
        self.classes: dict[str, int] = {}
        self.rendered = None
        self.charts_drawn = None
        self.charts: dict[str, dict[str, int | str | None]] = {}
        self._chart: str | None = None

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        classes = (attributes.get("class") or "").split()
        for name in classes:
            self.classes[name] = self.classes.get(name, 0) + 1
        if tag == "body":
            self.rendered = attributes.get("data-rendered")
            self.charts_drawn = attributes.get("data-charts")
        if tag == "svg" and "chart" in classes:
            self._chart = attributes["id"]
            self.charts[self._chart] = {"drawn": attributes.get("data-drawn"), "series": 0,
                                        "bar": 0, "point": 0}
        elif self._chart is not None:
            chart = self.charts[self._chart]
            if tag == "path" and "series" in classes and (attributes.get("d") or "").strip():
                chart["series"] += 1
            for mark in ("bar", "point"):
                chart[mark] += mark in classes

    def handle_endtag(self, tag):
        if tag == "svg":
            self._chart = None


RUN_CHARTS = ("chart-pass-at-k", "chart-task-reward", "chart-turns", "chart-tokens")
TRAINING_CHARTS = ("chart-train-reward-mean", "chart-train-loss", "chart-train-staleness-max",
                   "chart-train-trainer-idle", "chart-train-sampled-tokens-per-s")


def test_report_charts_a_rollout_run_and_adds_a_training_runs_curves(tmp_path):
    from skyrl_agent.evaluation.curves import training_series
    from skyrl_agent.evaluation.html import write_report

    runs = [make_trajectory("demo/a", i, r) for i, r in enumerate([1, 0, 0])]
    runs += [make_trajectory("demo/b", i, r) for i, r in enumerate([0, 0, 1])]
    write_report(tmp_path / "plain.html", summarize(runs), runs, "plain")
    plain = _Count()
    plain.feed((tmp_path / "plain.html").read_text())
    assert list(plain.charts) == list(RUN_CHARTS)
    assert plain.charts["chart-pass-at-k"]["point"] == 3  # k = 1, 2, 3
    assert plain.charts["chart-task-reward"]["bar"] == 2
    assert 'id="training-charts"' not in (tmp_path / "plain.html").read_text()
    write_training_metrics(tmp_path)
    write_report(tmp_path / "trained.html", summarize(runs), runs, "trained",
                 training=training_series(tmp_path))
    trained = _Count()
    trained.feed((tmp_path / "trained.html").read_text())
    assert list(trained.charts) == [*RUN_CHARTS, *TRAINING_CHARTS]  # no grad norm: not logged
    assert trained.charts["chart-train-reward-mean"]["series"] == 2  # reward and pass rate
    assert trained.charts["chart-train-loss"]["point"] == 4


@pytest.mark.slow
def test_html_report_renders_in_headless_chromium(tmp_path, smollm2_dir):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    assert browser, "Debian's chromium must be installed (scripts/setup.sh --dev)"
    write_run(tmp_path / "run", 5)
    write_training_metrics(tmp_path / "run")
    report = tmp_path / "report.html"
    result = cli("eval", str(tmp_path / "run"), "--html", str(report))
    assert result.returncode == 0, result.stderr
    counts = _Count()
    counts.feed(dump_dom(browser, report, tmp_path / "profile"))
    assert counts.rendered == "5"
    assert counts.classes.get("trajectory") == 5 and counts.classes.get("turn") == 15
    assert counts.classes.get("task-row") == 2
    # The charts: each one laid out by the browser with non-empty marks (the page's script
    # sets data-drawn from the marks' bounding box), in the run's and the training section.
    assert list(counts.charts) == [*RUN_CHARTS, *TRAINING_CHARTS]
    assert counts.charts_drawn == str(len(counts.charts))
    assert all(chart["drawn"] == "1" for chart in counts.charts.values()), counts.charts
    # Tasks t0 and t1 have 3 and 2 samples: pass@k for k = 1..3 (pass@3 over t0 alone); one
    # bar per task.
    assert counts.charts["chart-pass-at-k"] == {"drawn": "1", "series": 1, "bar": 0, "point": 3}
    assert counts.charts["chart-task-reward"]["bar"] == 2
    assert counts.charts["chart-turns"]["bar"] >= 1 and counts.charts["chart-tokens"]["bar"] >= 1
    assert counts.charts["chart-train-reward-mean"]["series"] == 2
    assert all(counts.charts[name]["series"] >= 1 for name in TRAINING_CHARTS)


def test_eval_reports_pass_at_k_beside_a_fully_masked_task(tmp_path):
    """Stops: one fully masked task hiding pass@k for the whole run (the metric printed over
    the other tasks, the exclusion said), and a pass@k that quietly averages fewer tasks."""
    write_run(tmp_path / "a", 4)  # demo/t0 and demo/t1, two samples each, reward 1
    store = TrajectoryStore(tmp_path / "a", writable=True)
    store.append([masked(make_trajectory("demo/t2", i)) for i in range(2)]
                 + [make_trajectory("demo/t0", 4, 0.0)])
    store.close()
    result = cli("eval", str(tmp_path / "a"))
    assert result.returncode == 0, result.stderr
    # t0: 2 of 3 passed, t1: 2 of 2; pass@3 holds t0 alone.
    assert "pass@1 0.833, pass@2 1.000, pass@3 1.000 (over 1 of 2 tasks)," in result.stdout
    assert "left out of pass@k: 1 of 3 tasks with every sample masked" in result.stdout


def test_eval_prints_stats_compares_and_exports_atif(tmp_path, smollm2_dir):
    write_run(tmp_path / "a", 4)
    write_run(tmp_path / "b", 2)
    result = cli("eval", str(tmp_path / "a"), "--compare", str(tmp_path / "b"),
                 "--atif", str(tmp_path / "atif"))
    assert result.returncode == 0, result.stderr
    assert "pass@1 1.000" in result.stdout and "demo/t0" in result.stdout
    exported = sorted((tmp_path / "atif").glob("*.json"))
    assert len(exported) == 4
    atif = json.loads(exported[0].read_text())
    assert atif["schema_version"].startswith("ATIF")
    assert [s["source"] for s in atif["steps"]] == ["user", "agent"] * 3
    assert atif["steps"][1]["metrics"]["completion_token_ids"] == [4, 5]
    # Harbor's own models read the export back, token ids and logprobs intact.
    from harbor.models.trajectories import Trajectory as AtifTrajectory

    stored = {f"{t.task_id}#{t.sample_index}": t
              for t in TrajectoryStore(tmp_path / "a").load().trajectories}
    for path in exported:
        atif_run = AtifTrajectory.model_validate_json(path.read_text())
        turns = [turn for seg in stored[atif_run.session_id].segments for turn in seg.turns]
        agent_steps = [step for step in atif_run.steps if step.source == "agent"]
        assert [tuple(s.metrics.completion_token_ids) for s in agent_steps] == \
            [t.completion_ids for t in turns]
        assert [tuple(s.metrics.logprobs) for s in agent_steps] == \
            [t.completion_logprobs for t in turns]


def test_bad_run_directories_give_one_clear_line(tmp_path):
    result = cli("eval", str(tmp_path / "missing"))
    assert result.returncode == 2 and "not a run directory" in result.stderr
    assert "Traceback" not in result.stderr
    write_run(tmp_path / "run", 2)
    store = TrajectoryStore(tmp_path / "run", writable=True)
    bad = store.append([make_trajectory("demo/t9", 9)])
    store.close()
    bad.write_bytes(b"garbage")
    result = cli("eval", str(tmp_path / "run"))
    assert result.returncode == 0 and bad.name in result.stderr
    assert "2 trajectories" in result.stdout  # the other shard is still read
    (tmp_path / "run" / "trajectories" / "index.jsonl").write_text(
        '{not json\n{"shard": "x", "keys": []}\n')
    result = cli("eval", str(tmp_path / "run"))
    assert result.returncode == 2 and "index.jsonl is corrupted at line 1" in result.stderr


@pytest.mark.slow
def test_regrade_uses_the_stored_final_state(tmp_path):
    run_dir = tmp_path / "run"
    result = cli("rollout", "--agent", "oracle", "--tasks", "demo", "--output", str(run_dir),
                 "--set", 'tasks.include=["hello-file", "word-count"]')
    assert result.returncode == 0, result.stderr
    nop_dir = tmp_path / "nop"
    result = cli("rollout", "--agent", "nop", "--tasks", "demo", "--output", str(nop_dir),
                 "--set", 'tasks.include=["hello-file"]')
    assert result.returncode == 0, result.stderr
    # Swap in the untouched (nop) state for one sample: its re-grade must drop to 0.
    shutil.copy(RunDir(nop_dir).state_path("demo/hello-file", 0),
                RunDir(run_dir).state_path("demo/hello-file", 0))
    result = cli("eval", str(run_dir), "--regrade")
    assert result.returncode == 0, result.stderr
    assert "re-graded 2 of 2; 1 agree" in result.stdout
