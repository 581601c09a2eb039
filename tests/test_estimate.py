"""A step's time said before it starts: from a step measured here earlier, else a calibration;
a warning when it will take minutes."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from skyrl_agent.config import load_config
from skyrl_agent.model.names import resolve_model
from skyrl_agent.rl.estimate import (
    WARN_AFTER_S,
    Rates,
    estimate_step,
    rates_path,
    remember,
    remembered,
)
from tests.test_cli import run

pytestmark = pytest.mark.slow

TERMINUS = ["--agent", "terminus", "--tasks", "gen:write-file:train:5", "--n", "8"]
"""The case a user met: Terminus, full fine-tune of SmolLM2, 5 tasks x 8 samples."""


@pytest.fixture
def own_cache(tmp_path, monkeypatch, smollm2_dir) -> Path:
    """A cache of this test's own (the converted model linked in from the real one)."""
    real_models = Path(smollm2_dir).parent
    monkeypatch.setenv("SKYRL_AGENT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / real_models.name).symlink_to(real_models)
    return tmp_path / "cache"


def fake(rates: Rates) -> None:
    """Rates remembered for TERMINUS's workload."""
    config = load_config(None, ["agent.name=terminus", "tasks.source=gen:write-file:train:5"])
    path = rates_path(config, resolve_model(config.inference.model))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dataclasses.asdict(rates)))


def test_the_dry_run_warns_when_a_step_will_take_minutes(own_cache, tmp_path):
    """Stops: a plan that says nothing of a step's time (the Terminus case sat > 9 minutes on
    its first step without a hint), or one that warns when a step is short."""
    fake(Rates(train_s=10.0, source="a fake calibration"))
    slow = run("train", "--dry-run", *TERMINUS, "--output", str(tmp_path / "x"))
    assert slow.returncode == 0, slow.stderr
    assert ("a step: 40 samples, up to 30,720 tokens sampled and trained; about 7 min "
            "(training only, at most) on this machine (a fake calibration)") in slow.stdout
    assert "warning: a step may take 7 min here" in slow.stdout
    fake(Rates(train_s=0.5, wait_s=0.25, tokens=120.0, source="measured by run-a, step 3"))
    quick = run("train", "--dry-run", *TERMINUS, "--output", str(tmp_path / "x"))
    assert ("a step: 40 samples, about 4,800 tokens sampled and trained; about 30 s on this "
            "machine (measured by run-a, step 3)") in quick.stdout
    assert "warning" not in quick.stdout


def test_without_a_measurement_the_dry_run_calibrates_and_remembers(own_cache, tmp_path):
    """Stops: a dry run that measures nothing when nothing was measured before, or one that
    measures again every time (the calibration is kept for the next plan, whatever its
    workload)."""
    result = run("train", "--dry-run", *TERMINUS, "--output", str(tmp_path / "x"))
    assert result.returncode == 0, result.stderr
    assert "(calibration passes scaled to the 2048-token context)" in result.stdout
    [stored] = (own_cache / "step-rates").iterdir()
    kept = Rates(**json.loads(stored.read_text()))
    assert kept.train_s > 0 and kept.wait_s is None
    stored.write_text(json.dumps(dataclasses.asdict(dataclasses.replace(kept, source="kept"))))
    again = run("train", "--dry-run", *TERMINUS, "--output", str(tmp_path / "x"))
    assert "on this machine (kept)" in again.stdout
    # It bounds training alone: another workload of the same model and trainer uses it too.
    other = run("train", "--dry-run", "--agent", "answer", "--tasks", "toy", "--output",
                str(tmp_path / "y"))
    assert "on this machine (kept)" in other.stdout
    assert len(list((own_cache / "step-rates").iterdir())) == 1


def test_a_finished_step_is_remembered_per_sample(own_cache):
    """Stops: costs kept per step instead of per sample (a plan with more samples would be
    off), and a step that trained nothing overwriting a measurement."""
    config = load_config(None, ["agent.name=terminus"])
    folder = resolve_model(config.inference.model)
    remember(config, folder, {"tokens": 300.0, "sampled_tokens": 400.0, "train_s": 8.0,
                              "wait_s": 4.0}, samples=4, where="measured by r, step 0")
    remember(config, folder, {"tokens": 0.0, "sampled_tokens": 0.0, "train_s": 0.1,
                              "wait_s": 9.0}, samples=4, where="nothing trained")
    assert remembered(config, folder) == Rates(2.0, 1.0, 100.0, "measured by r, step 0")
    estimate = estimate_step(config, folder, samples=10, measure=False)
    assert (estimate.tokens, estimate.bound, estimate.seconds) == (1000, False, 30.0)
    assert estimate.seconds < WARN_AFTER_S and len(estimate.lines()) == 1
    # Another trainer setting, agent, task set or budget samples and trains other amounts.
    for other in (["agent.name=terminus", "trainer.lora_rank=8"], ["agent.name=openhands"],
                  ["agent.name=terminus", "tasks.source=swe-mini"],
                  ["agent.name=terminus", "agent.max_turns=3"]):
        assert rates_path(load_config(None, other), folder) != rates_path(config, folder), other
    assert os.path.dirname(rates_path(config, folder)) == str(own_cache / "step-rates")
