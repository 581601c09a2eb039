"""`rollout` and `train` on a local JSONL of SWE-bench-format instances (the swe-mini ones): the
model-driven pipeline runs and stores, and stored final states (the agent's patch) re-grade."""

from __future__ import annotations

import shutil
import tarfile

import pytest

from skyrl_agent.data.store import TrajectoryStore
from tests.swe_helpers import INSTANCES, instance_rows
from tests.test_cli import run

pytestmark = pytest.mark.slow


@pytest.fixture
def instance_file(tmp_path):
    """The swe-mini instances copied away from their repos/ (the bundled repos are found)."""
    path = tmp_path / "mine.jsonl"
    shutil.copyfile(INSTANCES, path)
    return path


def test_openhands_rollout_on_a_local_jsonl(tmp_path, instance_file, tiny_model_dir):
    output = tmp_path / "run"
    result = run("rollout", "--agent", "openhands", "--tasks", str(instance_file), "-j", "2",
                 "--output", str(output), "--set", "tasks.limit=2",
                 "--set", f"inference.model={tiny_model_dir}", "--set", "agent.max_turns=1",
                 "--set", "inference.max_tokens=24")
    assert result.returncode == 0, result.stderr[-2000:]
    stored = TrajectoryStore(output).load().trajectories
    names = [f"mine/{row['instance_id']}" for row in instance_rows()[:2]]
    assert sorted(t.task_id for t in stored) == names
    for trajectory in stored:
        assert trajectory.num_turns >= 1 and not trajectory.masked
        assert trajectory.reward.reason is None  # the tests ran and were graded
        assert trajectory.reward.value == 0.0  # a random model fixes nothing
        assert set(trajectory.reward.components) == {"reward", "fail_to_pass", "pass_to_pass"}
    for state in (output / "final_state").iterdir():
        with tarfile.open(state) as bundle:
            assert bundle.getnames() == ["skyrl/swe/model.patch"]  # the agent's patch only


def test_stored_patches_regrade_and_train_plans(tmp_path, instance_file):
    output = tmp_path / "oracle"
    result = run("rollout", "--agent", "oracle", "--tasks", str(instance_file), "-j", "2",
                 "--output", str(output), "--set", "tasks.limit=2")
    assert result.returncode == 0, result.stderr[-2000:]
    assert [t.reward.value for t in TrajectoryStore(output).load().trajectories] == [1.0] * 2
    regraded = run("eval", str(output), "--regrade")
    assert regraded.returncode == 0, regraded.stderr
    assert "re-graded 2 of 2; 2 agree" in regraded.stdout
    plan = run("train", "--agent", "openhands", "--tasks", str(instance_file), "--dry-run",
               "--output", str(tmp_path / "train"))
    assert plan.returncode == 0, plan.stderr
    assert f"agent openhands on {len(instance_rows())} tasks of {instance_file}" in plan.stdout
