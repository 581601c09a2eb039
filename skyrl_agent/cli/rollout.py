"""`skyrl-agent rollout`: an agent on tasks with a model; trajectories into a run dir."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from skyrl_agent.cli.common import (
    ConfigOption,
    SetOption,
    console,
    run_with_progress,
    setup_logging,
)

if TYPE_CHECKING:
    from skyrl_agent.jobs.rollout import RolloutResult
    from skyrl_agent.types import Trajectory


def rollout(
    agent: Annotated[str, typer.Option(help="A registered agent (skyrl-agent agents list).")]
        = "terminus",
    tasks: Annotated[str, typer.Option(help="A bundled set, a task dir or a dir of tasks.")]
        = "demo",
    n: Annotated[int | None, typer.Option("--n", min=1, help=(
        "Samples per task (collector.n_samples_per_task)."))] = None,
    output: Annotated[Path | None, typer.Option(help="Run directory (output_dir).")] = None,
    endpoint: Annotated[str | None, typer.Option(
        help="A running OpenAI-compatible server; default: start the embedded one.")] = None,
    sandbox: Annotated[str | None, typer.Option(help="Sandbox backend: local or docker.")] = None,
    jobs: Annotated[int | None, typer.Option("--jobs", "-j", min=1, help=(
        "Rollouts run at once (collector.max_concurrent_sandboxes)."))] = None,
    config: ConfigOption = None,
    overrides: SetOption = None,
) -> None:
    """Run an agent on tasks with a model and store token-level trajectories in a run dir.

    Running it again on the same --output resumes: stored samples are skipped. Budgets default
    by where the model runs: on the embedded CPU server 6 turns of at most 128 tokens in a
    2,048-token context; on an --endpoint 50 turns of 1,024 tokens in 8,192 (agent.max_turns,
    inference.max_tokens, agent.max_context_tokens)."""
    from skyrl_agent.config import load_config
    from skyrl_agent.jobs.rollout import Rollout

    options = {"agent.name": agent, "tasks.source": tasks, "inference.endpoint": endpoint,
               "sandbox.backend": sandbox, "collector.max_concurrent_sandboxes": jobs,
               "collector.n_samples_per_task": n, "output_dir": output}
    setup_logging()
    settings = load_config(config, overrides, options)
    job = Rollout(settings, settings.collector.n_samples_per_task, settings.output_dir)
    setup_logging(job.run_dir.run_log)
    try:
        rewards: list[float] = []
        masked = 0

        def status(trajectory: Trajectory) -> str:
            nonlocal masked
            rewards.append(trajectory.reward.value)
            masked += trajectory.masked
            return f"reward {sum(rewards) / len(rewards):.2f} · masked {masked}"

        result = run_with_progress(job.run, total=len(job.pending), label="rollouts",
                                   status=status)
    finally:
        job.close()
    _print_rollout_table(result, job.run_dir.path)


def _print_rollout_table(result: RolloutResult, output: Path) -> None:
    from rich.table import Table
    table = Table("task", "sample", "reward", "finish", "turns", "note")
    for t in result.trajectories:
        table.add_row(t.task_id, str(t.sample_index), f"{t.reward.value:.2f}", t.finish_reason,
                      str(t.num_turns), t.mask_reason or t.reward.reason or "")
    console.print(table)
    trajectories = result.trajectories
    mean = sum(t.reward.value for t in trajectories) / max(1, len(trajectories))
    console.print(f"{len(trajectories)} trajectories, mean reward {mean:.3f} -> {output}")
    started = result.pool_hits + result.pool_misses
    if result.pool_hits:
        console.print(f"warm pool: {result.pool_hits} of {started} sandboxes were waiting")
