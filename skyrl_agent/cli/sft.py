"""`skyrl-agent sft`: fine-tune on a stored run's sampled tokens; the output folder serves."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from skyrl_agent.cli.common import (
    ConfigOption,
    SetOption,
    console,
    run_with_progress,
    setup_logging,
)


def sft(
    data: Annotated[Path, typer.Option(help="A run dir (from rollout) whose trajectories to "
                                            "imitate.")],
    model: Annotated[str | None, typer.Option(help=(
        "Model to fine-tune (default: the one the run sampled from)."))] = None,
    output: Annotated[Path, typer.Option(help="Folder for the fine-tuned model.")]
        = Path("runs/sft-model"),
    epochs: Annotated[int, typer.Option(min=1, help="Passes over the data.")] = 3,
    batch_size: Annotated[int, typer.Option(min=1, help="Sequences per optimizer step.")] = 8,
    config: ConfigOption = None,
    overrides: SetOption = None,
) -> None:
    """Supervised fine-tuning: cross-entropy on the tokens the run's model sampled (prompts and
    observations are not trained), masked trajectories left out. The trainer section of the
    config applies (trainer.learning_rate, trainer.lora_rank, ...)."""
    from skyrl_agent.config import load_config
    from skyrl_agent.errors import UserError
    from skyrl_agent.rl.sft import SftStep, plan_sft, run_sft

    setup_logging()
    settings = load_config(config, list(overrides or []))
    if output.exists() and any(output.iterdir()):
        raise UserError(f"{output} exists and is not empty; choose another --output")
    plan = plan_sft(settings, data, model, epochs, batch_size)
    console.print(f"sft: {len(plan.data)} sequences, {sum(d.num_loss_tokens for d in plan.data)}"
                  f" trained tokens, {plan.steps} steps on {plan.model}")

    async def work(on_step: Callable[[Any], None]) -> list[SftStep]:
        return await asyncio.to_thread(run_sft, settings, plan, output, epochs, batch_size,
                                       on_step)

    steps = run_with_progress(work, total=plan.steps, label="sft",
                              status=lambda s: f"epoch {s.epoch} · loss {s.loss:.3f}")
    by_epoch: dict[int, list[float]] = {}
    for step in steps:
        by_epoch.setdefault(step.epoch, []).append(step.loss)
    means = " ".join(f"{sum(losses) / len(losses):.4f}" for losses in by_epoch.values())
    console.print(f"{len(steps)} steps; mean loss by epoch: {means}")
    console.print(f"model -> {output}")
