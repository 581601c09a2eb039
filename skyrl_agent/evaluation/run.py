"""Reading a stored run for offline evaluation: its trajectories, tokenizer and tasks."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from skyrl_agent.data.run_dir import RunDir
from skyrl_agent.data.store import StoreError, TrajectoryStore
from skyrl_agent.errors import UserError
from skyrl_agent.tasks.spec import TaskSpec
from skyrl_agent.types import Trajectory

log = logging.getLogger(__name__)
Decode = Callable[[tuple[int, ...]], str]


def load_run(run_dir: Path) -> list[Trajectory]:
    """Every readable trajectory; damaged shards are logged as warnings and skipped."""
    contents = TrajectoryStore(run_dir).load()
    for problem in contents.problems:
        log.warning(problem)
    if not contents.trajectories:
        raise StoreError(f"{run_dir} holds no readable trajectories")
    return contents.trajectories


def run_model(run_dir: Path) -> str | None:
    """The model the run sampled from, per its config.json."""
    record = RunDir(run_dir).record()
    model = record.section("inference", "model") if record else None
    return model if isinstance(model, str) else None


def decoder(run_dir: Path) -> Decode | None:
    """Token ids -> text with the run's tokenizer, or None (reports then show token counts)."""
    model = run_model(run_dir)
    try:
        from transformers import AutoTokenizer

        from skyrl_agent.model.names import resolve_model
        tokenizer = AutoTokenizer.from_pretrained(resolve_model(model or ""))
    except Exception as exc:  # noqa: BLE001 - text is a convenience, counts still work
        log.warning("no tokenizer for model %r (%s); showing token counts instead of text",
                    model, exc)
        return None
    return lambda ids: str(tokenizer.decode(list(ids)))


def run_tasks(run_dir: Path) -> dict[str, TaskSpec]:
    """The run's tasks by name, from the task source in its config.json (empty if unreadable)."""
    from skyrl_agent.tasks import resolve_tasks
    record = RunDir(run_dir).record()
    source = record.section("tasks", "source") if record else None
    if not isinstance(source, str):
        return {}
    try:
        return {task.name: task for task in resolve_tasks(source)}
    except UserError:
        return {}
