"""End to end through the CLI: real SmolLM2 server, real local sandboxes, demo tasks, plug-ins."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from skyrl_agent.data.store import TrajectoryStore
from skyrl_agent.inference.process import embedded_server
from tests.conftest import REPO

pytestmark = pytest.mark.slow
CLI = [sys.executable, "-c", "from skyrl_agent.cli import main; main()"]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=900,
                          env={**os.environ, **(env or {})})


def read_run(run_dir: Path):
    contents = TrajectoryStore(run_dir).load()
    assert not contents.problems
    return contents.trajectories


@pytest.fixture(scope="module")
def server(smollm2_dir):
    with embedded_server("smollm2-135m") as process:
        yield process.url


@pytest.mark.parametrize("agent", ["terminus", "openhands"])
def test_agents_run_demo_tasks_with_the_real_model(agent, server, tmp_path):
    result = cli("rollout", "--agent", agent, "--tasks", "demo", "--endpoint", server,
                 "--output", str(tmp_path / "run"), "-j", "3",
                 "--set", "tasks.limit=3", "--set", "agent.max_turns=2",
                 "--set", "inference.max_tokens=64")
    assert result.returncode == 0, result.stderr[-2000:]
    trajectories = read_run(tmp_path / "run")
    assert len(trajectories) == 3 and {t.agent for t in trajectories} == {agent}
    for trajectory in trajectories:
        assert not trajectory.masked, trajectory.mask_reason
        assert trajectory.num_turns >= 1 and "drift_tokens" in trajectory.metrics
        for segment in trajectory.segments:
            assert segment.is_token_consistent()
            for turn in segment.turns:
                assert len(turn.completion_logprobs) == len(turn.completion_ids) > 0
                assert all(lp <= 0 for lp in turn.completion_logprobs)
    assert "mean reward" in result.stdout


def test_a_plugin_agent_installed_by_entry_point_runs(tmp_path, smollm2_dir):
    target = tmp_path / "site"
    source = shutil.copytree(REPO / "examples" / "hello-agent", tmp_path / "hello-agent")
    install = subprocess.run(  # from a copy: building leaves build/ files beside the sources
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(source)],
        capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr
    env = {"PYTHONPATH": str(target)}
    listed = cli("agents", "list", env=env)
    assert listed.returncode == 0 and "hello" in listed.stdout
    result = cli("rollout", "--agent", "hello", "--tasks", "demo", "--output",
                 str(tmp_path / "run"), "--set", 'tasks.include=["hello-file"]',
                 "--set", "inference.max_tokens=8", env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    (trajectory,) = read_run(tmp_path / "run")
    assert trajectory.agent == "hello" and trajectory.reward.value == 1.0
    assert trajectory.num_turns == 1 and trajectory.metrics["reply_chars"] >= 0


def test_unknown_agent_lists_the_available_ones(tmp_path):
    result = cli("rollout", "--agent", "nosuch", "--output", str(tmp_path / "run"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "unknown agent 'nosuch'" in result.stderr
    for name in ("nop", "openhands", "oracle", "terminus"):
        assert name in result.stderr
    assert not (tmp_path / "run").exists()
