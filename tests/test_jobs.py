"""Every command that starts sandboxes or writes a run dir prepares it through one call,
jobs/prepare.py's `prepare_run`, and the steps run in the same order for all of them."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest

import skyrl_agent.jobs
from skyrl_agent.cli import app
from skyrl_agent.config import load_config
from skyrl_agent.data.run_dir import RunDir
from skyrl_agent.data.store import TrajectoryStore
from skyrl_agent.errors import UserError
from skyrl_agent.jobs import prepare as preparation
from skyrl_agent.jobs.demos import DemoJob
from skyrl_agent.jobs.prepare import ROLLOUT, TRAIN, prepare_run
from skyrl_agent.jobs.rollout import Rollout


class Prepared(Exception):
    """Raised by the patched preparation: the command got there before any other work."""


@pytest.fixture
def calls(monkeypatch) -> list[preparation.Needs]:
    """prepare_run patched, in every job module, to record what a command needs and stop it."""
    seen: list[preparation.Needs] = []

    def refuse(config, needs, *args, **kwargs):
        seen.append(needs)
        raise Prepared

    for info in pkgutil.iter_modules(skyrl_agent.jobs.__path__):
        module = importlib.import_module(f"skyrl_agent.jobs.{info.name}")
        if hasattr(module, "prepare_run"):
            monkeypatch.setattr(module, "prepare_run", refuse)
    return seen


def _source_run(root: Path) -> Path:
    """A stored run for `demos --from` to copy (its record is all the command reads first)."""
    RunDir(root / "source").prepare(preparation.record_of(load_config(), 1))
    TrajectoryStore(root / "source", writable=True).close()
    return root / "source"


COMMANDS = {
    "rollout": (["rollout", "--tasks", "demo"], preparation.ROLLOUT),
    "demos": (["demos", "--tasks", "demo"], preparation.DEMOS),
    "demos --from": (["demos", "--from", "{source}"], preparation.COPY),
    "train": (["train"], preparation.TRAIN),
    "recipe": (["recipe"], preparation.DEMOS),  # its first stage
    "tasks check": (["tasks", "check", "demo"], preparation.CHECK),
    "tasks audit": (["tasks", "audit", "demo"], preparation.CHECK),
}


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_prepares_through_one_call(command, calls, tmp_path, work_root):
    args, needs = COMMANDS[command]
    args = [a.format(source=_source_run(tmp_path)) for a in args]
    output = tmp_path / "out"
    if not command.startswith("tasks"):
        args += ["--output", str(output)]
    with pytest.raises(Prepared):
        app([*args, "--set", f"sandbox.work_root={work_root}"], standalone_mode=False)
    assert calls == [needs]
    assert not (output / "config.json").exists()  # nothing written before the preparation


def test_training_preparation_refuses_heldout_tasks_before_writing(tmp_path, work_root):
    config = load_config(None, [f"sandbox.work_root={work_root}"],
                         {"tasks.source": "gen:count:heldout:2", "agent.name": "answer"})
    with pytest.raises(UserError, match="held-out"):
        prepare_run(config, TRAIN, tmp_path / "run")
    prepared = prepare_run(config, ROLLOUT, tmp_path / "eval",  # evaluation may use them
                           preparation.record_of(config, 1))
    assert prepared.store is not None
    prepared.store.close()
    assert len(prepared.tasks) == 2 and (tmp_path / "eval" / "config.json").is_file()


def test_every_command_runs_the_backend_preflight(tmp_path, work_root, monkeypatch):
    """Demos and audits skipped the backend's preflight before there was one preparation."""
    checked: list[int] = []
    monkeypatch.setattr("skyrl_agent.sandboxes.base.preflight",
                        lambda tasks, config: checked.append(len(tasks)))
    config = load_config(None, [f"sandbox.work_root={work_root}"],
                         {"tasks.source": "demo", "agent.name": "terminus"})
    DemoJob(config, tmp_path / "demos").close()
    Rollout(config, 1, tmp_path / "rollout").close()
    assert len(checked) == 2 and checked[0] == checked[1] > 0


def test_a_broken_task_set_writes_no_run_dir(tmp_path, work_root):
    config = load_config(None, [f"sandbox.work_root={work_root}"],
                         {"tasks.source": str(tmp_path / "missing"), "agent.name": "terminus"})
    with pytest.raises(UserError):
        Rollout(config, 1, tmp_path / "run")
    assert not (tmp_path / "run").exists()
