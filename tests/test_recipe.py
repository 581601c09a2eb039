"""The warm-start recipe as one command: every stage's run dir is kept, training stages see only
training seeds and evaluations only held-out ones, and the same command resumes."""

from __future__ import annotations

import json

import pytest

from skyrl_agent.config import load_config
from skyrl_agent.data.store import TrajectoryStore
from skyrl_agent.errors import TaskError
from skyrl_agent.jobs.recipe import RL_CHECKPOINT_EVERY, RecipeSettings, rl_job
from skyrl_agent.rl.batch import sft_data
from skyrl_agent.tasks.families import split_of
from tests.test_cli import run

pytestmark = pytest.mark.slow
ARGS = ["--families", "count,sort-lines", "--train-seeds", "2", "--heldout-seeds", "1",
        "--sft-epochs", "1", "--rl-steps", "1", "--n", "2", "--groups-per-step", "2",
        "--eval-samples", "1", "--rl-seeds", "3", "--set", "agent.max_turns=2",
        "--set", "inference.max_tokens=112"]


def test_recipe_runs_every_stage_on_the_right_split(tmp_path, tiny_model_dir):
    out = tmp_path / "recipe"
    args = ["recipe", "--output", str(out), *ARGS, "--set", f"inference.model={tiny_model_dir}"]
    first = run(*args)
    assert first.returncode == 0, first.stderr
    for stage in ("demos", "train", "eval-base", "eval-sft", "eval-rl"):
        assert (out / stage / "trajectories").is_dir(), stage
    for model in ("sft-model", "rl-model"):
        assert (out / model / "config.json").is_file()
    demos = TrajectoryStore(out / "demos").load().trajectories
    trained = TrajectoryStore(out / "train").load().trajectories
    assert len(demos) == 4 and len(trained) >= 4
    assert {split_of(t.task_id) for t in demos + trained} == {"train"}
    # RL samples from 3 training seeds a family, of which the demonstrations covered 2.
    rl_tasks = json.loads((out / "train" / "config.json").read_text())["config"]["tasks"]
    assert rl_tasks["source"] == "gen:count,sort-lines:train:3"
    assert sum(d.num_loss_tokens for d in sft_data(demos)) > 0  # what sft trained on
    for model in ("base", "sft", "rl"):
        evaluated = TrajectoryStore(out / f"eval-{model}").load().trajectories
        assert {t.task_id for t in evaluated} == {"gen/count-d1-10000",
                                                  "gen/sort-lines-d1-10000"}
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["scores"]) == {"base", "sft", "rl"}
    assert all(0 <= s["pass_rate"] <= 1 and s["samples"] + s["masked"] == 2
               for s in summary["scores"].values())
    assert "held-out pass rate" in first.stdout

    again = run(*args)  # finished stages are skipped, nothing is sampled twice
    assert again.returncode == 0, again.stderr
    assert "sft: done before" in again.stdout and "train: done before" in again.stdout
    assert len(TrajectoryStore(out / "train").load().trajectories) == len(trained)


def test_rl_seeds_default_to_the_demonstrations_and_are_checked():
    assert RecipeSettings(train_seeds=5).rl_source == RecipeSettings(train_seeds=5).train_source
    assert RecipeSettings(train_seeds=5, rl_seeds=9).rl_source.endswith(":train:9")
    with pytest.raises(TaskError, match="count must be"):
        RecipeSettings(rl_seeds=10_001).check()  # past the training split


def test_a_killed_rl_stage_loses_at_most_a_few_steps(tmp_path, tiny_model_dir):
    """An RL stage checkpoints before its last step, so a killed stage (an OOM kill once cost
    6 of 8 steps) resumes from a recent checkpoint instead of from the warm start."""
    config = load_config(None, ["agent.name=terminus", f"inference.model={tiny_model_dir}"])
    for steps in (1, 8):
        settings = RecipeSettings(families="count", train_seeds=2, rl_steps=steps)
        job = rl_job(config, settings, tiny_model_dir, tmp_path / f"train-{steps}")
        every = job.config.trainer.checkpoint_every
        assert every <= RL_CHECKPOINT_EVERY and (every < steps or steps == 1)
