"""`train`: the async loop reproduces the reference loop at max_staleness=0, keeps every trained
token within the bound, and resumes after kill -9 without losing or repeating work."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from skyrl_agent.config import load_config
from skyrl_agent.data.store import TrajectoryStore
from skyrl_agent.jobs.train import TrainJob, reference_run
from skyrl_agent.rl.checkpoints import Checkpoints
from skyrl_agent.rl.estimate import rates_path, remembered
from skyrl_agent.rl.loop import oldest_version
from skyrl_agent.rl.metrics import read_metrics
from skyrl_agent.types import TrajectoryGroup
from tests.test_cli import CLI, assert_one_line_error, run
from tests.tiny_models import char_model_dir

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return char_model_dir(tmp_path_factory.mktemp("train") / "model")


def settings(model, work_root, *extra: str):
    return load_config(None, [
        "agent.name=answer", "tasks.source=toy", f"inference.model={model}",
        "inference.max_tokens=8", "collector.n_samples_per_task=8",
        "trainer.learning_rate=3e-2", f"sandbox.work_root={work_root}", *extra])


def test_max_staleness_0_is_the_reference_loop(model, work_root, tmp_path):
    config = settings(model, work_root, "trainer.max_steps=3", "trainer.max_staleness=0")
    reference = asyncio.run(reference_run(config, tmp_path / "reference"))
    job = TrainJob(config, tmp_path / "async")
    trained = asyncio.run(job.run())
    assert [r.step for r in trained] == [0, 1, 2]
    for ours, theirs in zip(trained, reference, strict=True):
        assert ours.reward_mean == theirs.reward_mean
        assert ours.metrics["loss"] == pytest.approx(theirs.metrics["loss"], rel=1e-5, abs=1e-7)
        assert ours.metrics["grad_norm"] == pytest.approx(theirs.metrics["grad_norm"], rel=1e-4)
        assert ours.metrics["dropped_stale"] == 0


def test_no_trained_token_is_older_than_the_bound(model, work_root, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")  # W&B's files stay in the run dir
    config = settings(model, work_root, "trainer.max_steps=6", "trainer.max_staleness=1",
                      "trainer.checkpoint_every=6", "trainer.wandb_project=skyrl-agent-tests")
    asyncio.run(TrainJob(config, tmp_path / "run").run())
    state = json.loads((Checkpoints(tmp_path / "run").latest() / "loop.json").read_text())
    assert state["step"] == 6 and len(state["trained"]) == 6
    assert len(set(state["trained"])) == len(state["trained"])
    stored = TrajectoryStore(tmp_path / "run").load().trajectories
    for step, position in enumerate(state["trained"]):  # one group a step, in training order
        group = TrajectoryGroup("toy/eight-a", tuple(
            t for t in stored if t.sample_index // 8 == position))
        assert len(group.trajectories) == 8
        assert step - oldest_version(group) <= 1
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == list(range(6))
    assert max(r["staleness_max"] for r in rows) == 1  # the async path did run ahead
    assert all(r["sampled_tokens"] > 0 and 0 <= r["pass_rate"] <= 1 for r in rows)
    # The last step's costs per sample are kept for the next plan's time estimate.
    kept = remembered(config, Path(model))
    assert kept is not None and kept.source == "measured by run, step 5"
    assert kept.tokens == pytest.approx(rows[-1]["sampled_tokens"] / 8)
    assert kept.train_s == pytest.approx(rows[-1]["train_s"] / 8)
    rates_path(config, Path(model)).unlink()
    assert (tmp_path / "run" / "tensorboard").is_dir()
    # The same steps went to W&B: its offline record names every metric of every step.
    [record] = (tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb")
    logged = record.read_bytes()
    for name in ("reward_mean", "staleness_max", "generation_idle", "agreement/max_abs_diff"):
        assert name.encode() in logged, name


def assert_nothing_lost_or_repeated(run_dir: Path, steps: int, groups: int, stored_before: int):
    """A resumed run reached `steps` having trained `groups` groups, each once and none it
    dropped; it kept every stored sample and stored none twice. Its state and samples."""
    state = json.loads((Checkpoints(run_dir).latest() / "loop.json").read_text())
    assert state["step"] == steps
    assert len(set(state["trained"])) == len(state["trained"]) == groups
    assert not set(state["trained"]) & set(state["dropped"])
    stored = TrajectoryStore(run_dir).load().trajectories
    assert len(stored) >= stored_before  # nothing lost
    assert len({(t.task_id, t.sample_index) for t in stored}) == len(stored)  # none twice
    return state, stored


def test_kill_9_then_resume_loses_and_repeats_nothing(model, work_root, tmp_path):
    run_dir = tmp_path / "run"
    args = ["train", "--agent", "answer", "--tasks", "toy", "--n", "8", "--steps", "6",
            "--output", str(run_dir), "--set", f"inference.model={model}",
            "--set", "inference.max_tokens=8", "--set", "trainer.learning_rate=3e-2",
            "--set", "trainer.checkpoint_every=2", "--set", f"sandbox.work_root={work_root}"]
    process = subprocess.Popen([*CLI, *args], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    while not (run_dir / "checkpoints" / "step-000002" / "loop.json").exists():
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    time.sleep(1.5)  # let it sample (and maybe train) past the checkpoint
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    stored_before = len(TrajectoryStore(run_dir).load().trajectories)

    assert_one_line_error(run(*args), "--resume")
    assert_one_line_error(run(*args, "--resume", "--set", "trainer.learning_rate=1"),
                          "other settings")
    # The run's own settings are the base: --output and --resume are enough. The backend may
    # change: the one-process run goes on sharded over two FSDP2 ranks.
    resumed = run("train", "--output", str(run_dir), "--resume", "--set",
                  "trainer.backend=fsdp", "--set", "trainer.data_parallel=2")
    assert resumed.returncode == 0, resumed.stderr
    assert "resume from" in resumed.stdout and "FSDP2 over 2 rank processes" in resumed.stdout
    assert (run_dir / "curves" / "reward.png").is_file() and "curves:" in resumed.stdout
    state, stored = assert_nothing_lost_or_repeated(run_dir, 6, 6, stored_before)
    positions = {t.sample_index // 8 for t in stored}
    assert set(state["trained"]) | set(state["dropped"]) <= positions
    # The killed run's sandboxes are reaped; one still dying when the resumed run started is
    # retried by the next reaping, which must then leave nothing.
    from skyrl_agent.sandboxes.local_disk import reap_stale_sandboxes
    reap_stale_sandboxes(work_root)
    assert not any(work_root.iterdir())


def test_a_megatron_run_finishes_and_resumes_in_one_process(model, work_root, tmp_path):
    """`train` with the model split over two Megatron ranks, then one more step on the torch
    backend from the Megatron checkpoint."""
    run_dir = tmp_path / "run"
    first = run("train", "--agent", "answer", "--tasks", "toy", "--n", "8", "--steps", "2",
                "--output", str(run_dir), "--set", f"inference.model={model}",
                "--set", "inference.max_tokens=8", "--set", "trainer.checkpoint_every=1",
                "--set", f"sandbox.work_root={work_root}", "--set", "trainer.backend=megatron",
                "--set", "trainer.tensor_parallel=2")
    assert first.returncode == 0, first.stderr
    assert "Megatron over 2 rank processes" in first.stdout
    resumed = run("train", "--output", str(run_dir), "--resume", "--steps", "3", "--set",
                  "trainer.backend=torch", "--set", "trainer.tensor_parallel=1")
    assert resumed.returncode == 0, resumed.stderr
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(r["agreement/max_abs_diff"] < 1e-3 for r in rows if "agreement/max_abs_diff" in r)


def test_train_rejects_bad_input_with_one_line(tmp_path):
    assert_one_line_error(run("train", "--agent", "oracle", "--output", str(tmp_path / "x")),
                          "never calls the model")
    assert_one_line_error(run("train", "--set", "trainer.max_staleness=-1",
                              "--output", str(tmp_path / "x")), "max_staleness")
    assert_one_line_error(run("train", "--set", "trainer.advantage=rloo", "--set",
                              "collector.n_samples_per_task=1", "--output", str(tmp_path / "x")),
                          "n_samples_per_task >= 2")
    assert_one_line_error(run("train", "--set", "trainer.data_parallel=2",
                              "--output", str(tmp_path / "x")), "needs backend=fsdp")
    assert_one_line_error(run("train", "--set", "trainer.backend=megatron", "--set",
                              "trainer.tensor_parallel=2", "--output", str(tmp_path / "x")),
                          "must divide the model's 9 attention heads")
    dry = run("train", "--dry-run", "--output", str(tmp_path / "x"))
    assert dry.returncode == 0 and "steps of" in dry.stdout
    assert "torch in one process" in dry.stdout
    dry = run("train", "--dry-run", "--output", str(tmp_path / "x"), "--set",
              "trainer.backend=fsdp", "--set", "trainer.data_parallel=3")
    assert dry.returncode == 0 and "FSDP2 over 3 rank processes" in dry.stdout
    assert not (tmp_path / "x").exists()  # a dry run writes nothing
