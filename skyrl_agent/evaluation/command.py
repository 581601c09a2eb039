"""`skyrl-agent eval RUN_DIR`: judge stored trajectories without re-running agents."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from skyrl_agent.collector.store import StoreError, TrajectoryStore
from skyrl_agent.errors import UserError
from skyrl_agent.evaluation.stats import RunSummary, compare
from skyrl_agent.tasks.model import TaskSpec
from skyrl_agent.types import Trajectory


def load_run(run_dir: Path, err: Console) -> list[Trajectory]:
    """Every readable trajectory; damaged shards are named on stderr and skipped."""
    contents = TrajectoryStore(run_dir).load()
    for problem in contents.problems:
        err.print(f"[yellow]warning:[/yellow] {problem}", highlight=False)
    if not contents.trajectories:
        raise StoreError(f"{run_dir} holds no readable trajectories")
    return contents.trajectories


def run_model(run_dir: Path) -> str | None:
    try:
        return json.loads((run_dir / "config.json").read_text())["config"]["inference"]["model"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def decoder(run_dir: Path, err: Console) -> Any:
    """Token ids -> text with the run's tokenizer, or None (reports then show token counts)."""
    model = run_model(run_dir)
    try:
        from transformers import AutoTokenizer

        from skyrl_agent.inference.models import resolve_model
        tokenizer = AutoTokenizer.from_pretrained(resolve_model(model or ""))
    except Exception as exc:  # noqa: BLE001 - text is a convenience, counts still work
        err.print(f"[yellow]warning:[/yellow] no tokenizer for model {model!r} ({exc}); "
                  "showing token counts instead of text", highlight=False)
        return None
    return lambda ids: tokenizer.decode(list(ids))


def print_summary(summary: RunSummary, console: Console, title: str) -> None:
    pass_at = ", ".join(f"pass@{k} {v:.3f}" for k, v in summary.pass_at.items())
    console.print(f"[bold]{title}[/bold]: {summary.trajectories} trajectories, {summary.tasks} "
                  f"tasks, reward mean {summary.reward_mean:.3f}, {pass_at}, "
                  f"masked {summary.masked}", highlight=False)
    console.print(f"turns {summary.turns_mean:.1f}, prompt tokens {summary.prompt_tokens_mean:.0f}"
                  f", completion tokens {summary.completion_tokens_mean:.0f}, summaries "
                  f"{summary.summaries_total}, drift tokens {summary.drift_tokens_mean:.1f}; "
                  f"finish reasons {summary.finish_reasons}", highlight=False)
    table = Table("task", "samples", "passed", "reward mean", "masked", "turns")
    for row in summary.per_task:
        table.add_row(row.task_id, str(row.samples), str(row.passed), f"{row.reward_mean:.3f}",
                      str(row.masked), f"{row.turns_mean:.1f}")
    console.print(table)


def print_comparison(a: RunSummary, b: RunSummary, names: tuple[str, str],
                     console: Console) -> None:
    table = Table("task", names[0], names[1], "change")
    for delta in compare(a, b):
        change = ("" if delta.reward_a is None or delta.reward_b is None
                  else f"{delta.reward_b - delta.reward_a:+.3f}")
        table.add_row(delta.task_id, *(f"{r:.3f}" if r is not None else "-"
                                       for r in (delta.reward_a, delta.reward_b)), change)
    console.print(table)
    console.print(f"reward mean {a.reward_mean:.3f} -> {b.reward_mean:.3f} "
                  f"({b.reward_mean - a.reward_mean:+.3f})")


def _run_tasks(run_dir: Path) -> dict[str, TaskSpec]:
    """The run's tasks by name, from the task source in its config.json (empty if unreadable)."""
    from skyrl_agent.tasks import resolve_tasks
    try:
        source = json.loads((run_dir / "config.json").read_text())["config"]["tasks"]["source"]
        return {task.name: task for task in resolve_tasks(source)}
    except (OSError, KeyError, ValueError, UserError):
        return {}


def print_regrades(trajectories: list[Trajectory], run_dir: Path, sandbox: str | None,
                   jobs: int, console: Console) -> None:
    from skyrl_agent.config import SandboxConfig
    from skyrl_agent.evaluation.regrade import regrade

    config = SandboxConfig(backend=sandbox) if sandbox else SandboxConfig()
    results = asyncio.run(regrade(trajectories, run_dir, config, jobs, _run_tasks(run_dir)))
    table = Table("task", "sample", "stored", "regraded", "note")
    for r in results:
        regraded = "-" if r.regraded is None else f"{r.regraded:.3f}"
        table.add_row(r.task_id, str(r.sample_index), f"{r.stored:.3f}", regraded, r.note)
    console.print(table)
    same = sum(1 for r in results if r.regraded is not None and r.regraded == r.stored)
    done = sum(1 for r in results if r.regraded is not None)
    console.print(f"re-graded {done} of {len(results)}; {same} agree with the stored reward")
