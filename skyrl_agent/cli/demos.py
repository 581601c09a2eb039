"""`skyrl-agent demos`: reference solutions acted out by an agent (or the rewarded samples of a
stored run), kept in a run dir that `sft --data` reads."""

from __future__ import annotations

import time
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
    from skyrl_agent.jobs.demos import DemoOutcome


def demos(
    agent: Annotated[str, typer.Option(help="terminus or openhands: whose reply format.")]
        = "terminus",
    tasks: Annotated[str, typer.Option(help="Tasks whose solutions to act out (default: every "
                                            "family's training seeds).")] = "gen:all:train",
    output: Annotated[Path | None, typer.Option(help=(
        "Run directory (default: runs/demos-DATE-TIME)."))] = None,
    from_run: Annotated[Path | None, typer.Option("--from", help=(
        "Rejection sampling instead: keep the rewarded trajectories of this stored run."))]
        = None,
    min_reward: Annotated[float, typer.Option(help="With --from: the reward a kept trajectory "
                                                   "reaches.")] = 1.0,
    sandbox: Annotated[str | None, typer.Option(help="Sandbox backend: local or docker.")] = None,
    jobs: Annotated[int | None, typer.Option("--jobs", "-j", min=1, help=(
        "Demonstrations run at once (collector.max_concurrent_sandboxes)."))] = None,
    config: ConfigOption = None,
    overrides: SetOption = None,
) -> None:
    """Record demonstrations: each task's reference solution becomes the agent's own replies
    (Terminus: JSON whose keystrokes are the solution's commands; openhands: tool calls), served
    to the real agent by a scripted teacher, run in a sandbox and verified. Only reward-1
    demonstrations with consistent token arrays are kept. The teacher's tokens carry logprob
    0.0 (probability 1): they are for `sft`, which trains cross-entropy on them. Budgets are
    the run's own (inference.max_tokens, agent.max_turns): a reply that does not fit is
    dropped. The same command on the same --output resumes."""
    from skyrl_agent.config import load_config

    setup_logging()
    output = output or Path("runs") / time.strftime("demos-%Y%m%d-%H%M%S")
    if from_run is not None:
        _rejection_sampling(from_run, output, min_reward)
        return
    from skyrl_agent.jobs.demos import DemoJob

    options = {"agent.name": agent, "tasks.source": tasks, "output_dir": output,
               "sandbox.backend": sandbox, "collector.max_concurrent_sandboxes": jobs}
    settings = load_config(config, overrides, options)
    job = DemoJob(settings, settings.output_dir)
    setup_logging(job.run_dir.run_log)
    try:
        kept = 0

        def status(outcome: DemoOutcome) -> str:
            nonlocal kept
            kept += outcome.kept
            return f"kept {kept}"

        outcomes = run_with_progress(job.run, total=len(job.pending), label="demos",
                                     status=status)
    finally:
        job.close()
    _print_outcomes(outcomes, job.run_dir.path, stored=len(job.store))


def _rejection_sampling(source: Path, output: Path, min_reward: float) -> None:
    from skyrl_agent.jobs.demos import keep_rewarded

    result = keep_rewarded(source, output, min_reward)
    dropped = ", ".join(f"{n} {why}" for why, n in sorted(result.reasons.items()))
    console.print(f"kept {result.kept} of {result.total} trajectories (reward >= "
                  f"{min_reward:g}){'; dropped: ' + dropped if dropped else ''} -> {output}",
                  markup=False)


def _print_outcomes(outcomes: list[DemoOutcome], output: Path, stored: int) -> None:
    from rich.table import Table

    dropped = [o for o in outcomes if not o.kept]
    if dropped:
        table = Table("dropped task", "reward", "why")
        for o in dropped:
            table.add_row(o.task, f"{o.reward:.2f}", o.reason or "")
        console.print(table)
    kept = len(outcomes) - len(dropped)
    console.print(f"{kept} of {len(outcomes)} demonstrations kept now; {stored} stored in "
                  f"{output}")
