"""`skyrl-agent train`: asynchronous RL of an agent on tasks, resumable from its run dir."""

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
    from skyrl_agent.rl.step import StepResult

SHOWN = ("loss", "grad_norm", "agreement/max_abs_diff", "staleness_max", "dropped_stale",
         "trainer_idle")


def train(
    agent: Annotated[str | None, typer.Option(help=(
        "A registered agent that calls the model: answer (default), terminus, openhands, ..."))]
        = None,
    tasks: Annotated[str | None, typer.Option(help=(
        "A bundled set, a task dir or a dir of tasks (default: toy)."))] = None,
    n: Annotated[int | None, typer.Option("--n", min=2, help=(
        "Samples per task, the group size (collector.n_samples_per_task; default: 8)."))]
        = None,
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
    ray: Annotated[str | None, typer.Option(help=(
        "Run the parts as Ray actors (ray.address): auto (the running cluster, else a local "
        "instance), local, or a cluster's address. Default: one process."))] = None,
    config: ConfigOption = None,
    overrides: SetOption = None,
) -> None:
    """Train an agent with RL: sampling and training overlap within trainer.max_staleness
    policy versions; metrics per step on stdout, in RUN_DIR/metrics.jsonl and TensorBoard
    (RUN_DIR/tensorboard). Ctrl-C or SIGTERM stops it; --resume continues from the last
    checkpoint (trainer.checkpoint_every) and the stored trajectories."""
    from skyrl_agent.evaluation.stats import describe_time
    from skyrl_agent.jobs.train import TrainJob, placement_of, train_settings
    from skyrl_agent.types import TIME_ACCOUNT

    setup_logging()
    settings = train_settings(config, overrides, {
        "agent.name": agent, "tasks.source": tasks, "collector.n_samples_per_task": n,
        "trainer.max_steps": steps, "inference.endpoint": endpoint, "ray.address": ray,
        "output_dir": output}, resume)
    job = TrainJob(settings, settings.output_dir, resume=resume, placement=placement_of(settings))
    console.print(job.plan(calibrate=dry_run))
    if dry_run:
        return
    setup_logging(job.run_dir.run_log)

    def show(result: StepResult) -> None:
        parts = [f"{key} {result.metrics[key]:.4g}" for key in SHOWN if key in result.metrics]
        console.print(f"step {result.step}: reward {result.reward_mean:.3f} · " +
                      " · ".join(parts), highlight=False)
        spent = {bucket: result.metrics.get(f"time/{bucket}_s", 0.0) for bucket in TIME_ACCOUNT}
        if any(spent.values()):
            console.print(f"  seconds per trajectory: {describe_time(spent)}", highlight=False)

    results = run_with_progress(job.run, total=settings.trainer.max_steps, label="train",
                                status=lambda r: f"step {r.step} · reward {r.reward_mean:.2f}",
                                on_result=show)
    last = results[-1] if results else None
    if last is not None:
        console.print(f"trained to step {last.step + 1}; run dir {job.run_dir.path} "
                      f"(tensorboard --logdir {job.run_dir.tensorboard})")
    from skyrl_agent.evaluation.curves import write_curves

    curves = write_curves(job.run_dir.path)
    if curves:
        console.print(f"curves: {curves[0].parent} ({len(curves)} PNGs)")
