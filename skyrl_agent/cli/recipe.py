"""`skyrl-agent recipe`: the warm start, end to end, on generated task families.

demos on the training seeds -> sft -> train (RL) on the training seeds -> eval of the base, the
fine-tuned and the RL model on held-out seeds. Every stage keeps its run dir under --output; the
same command resumes (finished stages are skipped)."""

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
    from skyrl_agent.config import RunConfig
    from skyrl_agent.jobs.recipe import Layout, RecipeSettings, Score

DEFAULTS = {"inference.max_tokens": 128, "agent.max_turns": 3, "agent.timeout_s": 600}
"""Budgets a demonstration fits (one reply of commands, one to confirm, one spare) and a
deadline long enough for a loaded 2-core machine; `--set` overrides any of them."""


def recipe(
    output: Annotated[Path, typer.Option(help="Folder for every stage's run dir.")],
    agent: Annotated[str, typer.Option(help="terminus or openhands.")] = "terminus",
    families: Annotated[str, typer.Option(help="Task families (names, NAME@DIFFICULTY, all).")]
        = "write-file,count,sort-lines,replace-text",
    train_seeds: Annotated[int, typer.Option(min=1, help="Training seeds per family.")] = 12,
    heldout_seeds: Annotated[int, typer.Option(min=1, help="Held-out seeds per family.")] = 4,
    sft_epochs: Annotated[int, typer.Option(min=1)] = 2,
    sft_lr: Annotated[float, typer.Option(min=0.0)] = 5e-5,
    rl_steps: Annotated[int, typer.Option(min=1)] = 4,
    rl_lr: Annotated[float, typer.Option(min=0.0)] = 1e-5,
    n: Annotated[int, typer.Option("--n", min=2, help="RL group size.")] = 4,
    groups_per_step: Annotated[int, typer.Option(min=1)] = 4,
    eval_samples: Annotated[int, typer.Option(min=1, help="Samples per held-out task.")] = 2,
    rl_seeds: Annotated[int, typer.Option(min=0, help="Training seeds per family for RL "
                                          "(0: the demonstrations' seeds).")] = 0,
    config: ConfigOption = None,
    overrides: SetOption = None,
) -> None:
    """Warm start then RL, measured on held-out tasks: demos -> sft -> train -> eval (base,
    sft, rl). Prints the held-out pass rate of each model and each stage's wall-clock, and
    writes OUTPUT/summary.json. The training stages run in child processes, so the memory a
    trainer keeps is returned before the next stage."""
    from skyrl_agent.config import load_config
    from skyrl_agent.jobs.recipe import MODELS, Layout, RecipeSettings

    setup_logging()
    settings = RecipeSettings(families, train_seeds, heldout_seeds, sft_epochs, 8, sft_lr,
                              rl_steps, rl_lr, n, groups_per_step, eval_samples, rl_seeds)
    settings.check()
    base = load_config(config, overrides, {**DEFAULTS, "agent.name": agent})
    layout = Layout(output)
    output.mkdir(parents=True, exist_ok=True)
    setup_logging(layout.log)
    seconds: dict[str, float] = {}
    scores: dict[str, Score] = {}
    for stage in STAGES:
        started = time.monotonic()
        STAGES[stage](base, settings, layout)
        seconds[stage] = time.monotonic() - started
    for model in MODELS:
        started = time.monotonic()
        scores[model] = _evaluate(base, settings, layout, model)
        seconds[f"eval-{model}"] = time.monotonic() - started
    _print_summary(settings, scores, seconds, layout.write_summary(settings, scores, seconds))


def _demos(base: RunConfig, settings: RecipeSettings, layout: Layout) -> None:
    from skyrl_agent.jobs.recipe import demos_job

    job = demos_job(base, settings.train_source, layout.demos)
    try:
        run_with_progress(job.run, total=len(job.pending), label="demos",
                          status=lambda o: "kept" if o.kept else "dropped")
        console.print(f"demos: {len(job.store)} kept -> {layout.demos}")
    finally:
        job.close()


def _sft(base: RunConfig, settings: RecipeSettings, layout: Layout) -> None:
    from skyrl_agent.jobs.recipe import model_done, sft_stage
    from skyrl_agent.stopping import in_child

    if model_done(layout.sft_model):
        console.print(f"sft: done before -> {layout.sft_model}")
        return
    console.print(f"sft: training in a child process (log: {layout.log}) ...")
    losses = in_child(sft_stage, base, settings, layout.demos, layout.sft_model,
                      log_file=layout.log)
    console.print(f"sft: {len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f} -> "
                  f"{layout.sft_model}")


def _train(base: RunConfig, settings: RecipeSettings, layout: Layout) -> None:
    from skyrl_agent.jobs.recipe import model_done, rl_done, rl_stage
    from skyrl_agent.stopping import in_child

    if rl_done(layout.train, settings) and model_done(layout.rl_model):
        console.print(f"train: done before -> {layout.train}")
        return
    console.print(f"train: RL in a child process (log: {layout.log}) ...")
    rewards = in_child(rl_stage, base, settings, layout.sft_model, layout.train,
                       layout.rl_model, log_file=layout.log)
    console.print(f"train: reward by step {' '.join(f'{r:.2f}' for r in rewards)} -> "
                  f"{layout.train}, exported to {layout.rl_model}")


STAGES = {"demos": _demos, "sft": _sft, "train": _train}


def _evaluate(base: RunConfig, settings: RecipeSettings, layout: Layout, model: str) -> Score:
    from skyrl_agent.jobs.recipe import eval_job, score

    job = eval_job(base, settings, layout.model(model, base.inference.model), layout.eval(model))
    try:
        run_with_progress(job.run, total=len(job.pending), label=f"eval {model}",
                          status=lambda t: f"reward {t.reward.value:.0f}")
    finally:
        job.close()
    return score(layout.eval(model))


def _print_summary(settings: RecipeSettings, scores: dict[str, Score],
                   seconds: dict[str, float], summary: Path) -> None:
    from rich.table import Table

    table = Table("model", "held-out pass rate", "samples", "masked")
    for model, result in scores.items():
        table.add_row(model, f"{result.pass_rate:.3f}", str(result.samples), str(result.masked))
    console.print(table)
    console.print("seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in seconds.items()))
    console.print(f"held-out tasks {settings.heldout_source}; summary -> {summary}",
                  markup=False)
