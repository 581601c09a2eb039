"""`skyrl-agent train`: asynchronous RL of an agent on tasks, resumable from its run dir."""

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
    from skyrl_agent.trainers.reference_loop import StepResult

SHOWN = ("loss", "grad_norm", "agreement/max_abs_diff", "staleness_max", "dropped_stale",
         "trainer_idle")


def train(
    agent: Annotated[str, typer.Option(help=(
        "A registered agent that calls the model (terminus, openhands, answer, ...)."))]
        = "answer",
    tasks: Annotated[str, typer.Option(help="A bundled set, a task dir or a dir of tasks.")]
        = "toy",
    n: Annotated[int, typer.Option("--n", min=2, help=(
        "Samples per task, the group size (collector.n_samples_per_task)."))] = 8,
    steps: Annotated[int | None, typer.Option(min=1, help="Optimizer steps "
                                                           "(trainer.max_steps).")] = None,
    output: Annotated[Path | None, typer.Option(help=(
        "Run directory (default: runs/train-DATE-TIME, new for each run)."))] = None,
    resume: Annotated[bool, typer.Option(help="Continue the run in --output from its last "
                                              "checkpoint.")] = False,
    dry_run: Annotated[bool, typer.Option(help="Validate everything, print the plan, exit.")]
        = False,
    endpoint: Annotated[str | None, typer.Option(
        help="A running OpenAI-compatible server; default: start the embedded one.")] = None,
    config: ConfigOption = None,
    overrides: SetOption = None,
) -> None:
    """Train an agent with RL: sampling and training overlap within trainer.max_staleness
    policy versions; metrics per step on stdout, in RUN_DIR/metrics.jsonl and TensorBoard
    (RUN_DIR/tensorboard). Ctrl-C or SIGTERM stops it; --resume continues from the last
    checkpoint (trainer.checkpoint_every) and the stored trajectories."""
    from skyrl_agent.config import load_config
    from skyrl_agent.errors import UserError
    from skyrl_agent.trainers.train import TrainJob

    if output is None:
        if resume:
            raise UserError("--resume needs the run's --output RUN_DIR")
        output = Path("runs") / time.strftime("train-%Y%m%d-%H%M%S")
    flags = [f"agent.name={agent}", f"tasks.source={tasks}",
             f"collector.n_samples_per_task={n}", f"output_dir={output}"]
    flags += [f"trainer.max_steps={steps}"] if steps else []
    flags += [f"inference.endpoint={endpoint}"] if endpoint else []
    setup_logging()
    settings = load_config(config, [*flags, *(overrides or [])])
    job = TrainJob(settings, settings.output_dir, resume=resume)
    console.print(job.plan())
    if dry_run:
        return
    setup_logging(job.run_dir.run_log)

    def show(result: StepResult) -> None:
        parts = [f"{key} {result.metrics[key]:.4g}" for key in SHOWN if key in result.metrics]
        console.print(f"step {result.step}: reward {result.reward_mean:.3f} · " +
                      " · ".join(parts))

    results = run_with_progress(job.run, total=settings.trainer.max_steps, label="train",
                                status=lambda r: f"step {r.step} · reward {r.reward_mean:.2f}",
                                on_result=show)
    last = results[-1] if results else None
    if last is not None:
        console.print(f"trained to step {last.step + 1}; run dir {job.run_dir.path} "
                      f"(tensorboard --logdir {job.run_dir.tensorboard})")
