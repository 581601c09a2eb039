"""The time account: where an episode's seconds went (sandbox start, model calls, commands,
framework, hand-over, collection, verification, stop), measured on a real episode, stored in
Parquet, shown by `eval` and the HTML report."""

from __future__ import annotations

import dataclasses
import time

import pytest

from skyrl_agent.agents.terminus import TerminusAgent
from skyrl_agent.config import RunConfig
from skyrl_agent.data.schema import from_row, to_row
from skyrl_agent.evaluation.charts import run_charts
from skyrl_agent.evaluation.stats import describe_time, summarize
from skyrl_agent.rl.step import group_metrics
from skyrl_agent.types import TIME_ACCOUNT, TrajectoryGroup
from tests.scripted_server import replies
from tests.test_agents_scripted import DONE, HELLO, rollout, terminus, tokenizer  # noqa: F401

pytestmark = pytest.mark.slow
WAIT_S = 0.6


async def test_an_episode_accounts_for_its_time(tokenizer):  # noqa: F811
    script = replies(terminus("true\n", duration=WAIT_S), terminus(HELLO + "\n"), DONE, DONE)
    started = time.monotonic()
    trajectory, _ = await rollout(TerminusAgent(), "demo/hello-file", script, tokenizer,
                                  config=RunConfig())
    wall = time.monotonic() - started
    assert trajectory.reward.value == 1.0 and trajectory.metrics["verified_separately"] == 1.0
    account = trajectory.time_account()
    assert list(account) == list(TIME_ACCOUNT)
    # Each bucket measured where it happens: the terminal's wait is command time, every turn's
    # round trip is model time, and the phases around the agent took some time each.
    assert trajectory.exec_time_s >= WAIT_S
    latencies = sum(t.latency_s for s in trajectory.segments for t in s.turns)
    assert trajectory.model_time_s >= latencies > 0
    for bucket in ("sandbox", "handover", "collect", "verify", "stop"):
        assert account[bucket] > 0, bucket
    # The buckets add up to the episode (framework is the rest, never negative), which lies
    # within the wall time of the call.
    named = sum(v for k, v in account.items() if k != "framework")
    assert named <= trajectory.total_time_s + 1e-6
    assert sum(account.values()) == pytest.approx(trajectory.total_time_s)
    assert trajectory.total_time_s <= wall
    assert trajectory.model_time_s + trajectory.exec_time_s <= trajectory.agent_time_s + 1e-6

    # Stored and read back as columns (framework derived, written for readers of the files).
    row = to_row(trajectory)
    assert row["framework_time_s"] == pytest.approx(trajectory.framework_time_s)
    assert from_row(row).time_account() == account
    # Shards from before the account read as zeros.
    old = {k: v for k, v in row.items() if k not in ("model_time_s", "exec_time_s",
                                                     "handover_time_s", "stop_time_s",
                                                     "framework_time_s", "total_time_s")}
    assert from_row(old).model_time_s == 0.0 and from_row(old).framework_time_s == 0.0

    # eval's summary, the train step's metrics and the report's chart read the same account.
    summary = summarize([trajectory, trajectory])
    assert summary.time_account == pytest.approx(account)
    metrics = group_metrics([TrajectoryGroup(trajectory.task_id, (trajectory,))])
    assert {b: metrics[f"time/{b}_s"] for b in TIME_ACCOUNT} == pytest.approx(account)
    assert any('id="chart-time-account"' in chart for chart in run_charts(summary, [trajectory]))
    line = describe_time(summary.time_account)
    assert line.startswith("sandbox ") and f"exec {trajectory.exec_time_s:.2f}s" in line


def test_a_run_without_times_says_so_and_draws_no_account():
    from skyrl_agent.types import FinishReason, Reward, Trajectory

    bare = Trajectory("demo/x", 0, "oracle", (), Reward(1.0), FinishReason.STOP)
    summary = summarize([bare])
    assert describe_time(summary.time_account) == "no time recorded"
    assert not any("chart-time-account" in chart for chart in run_charts(summary, [bare]))
    late = dataclasses.replace(bare, total_time_s=2.0, sandbox_time_s=0.5)
    assert late.framework_time_s == 1.5
    assert dataclasses.replace(bare, total_time_s=0.1, model_time_s=0.5).framework_time_s == 0.0
