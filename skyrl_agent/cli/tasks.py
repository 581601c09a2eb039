"""`skyrl-agent tasks ...`: inspect task sets and check them with a model-free agent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from skyrl_agent.cli.common import (
    ConfigOption,
    SetOption,
    console,
    median,
    run_with_progress,
    setup_logging,
)

app = typer.Typer(no_args_is_help=True, help="Inspect and check Harbor-format task sets.")


@app.command("list")
def tasks_list(name: Annotated[str | None, typer.Argument(
        help="A task set or path; without it, the bundled sets.")] = None) -> None:
    """List bundled task sets, or the tasks of one set."""
    from rich.markup import escape
    from rich.table import Table

    from skyrl_agent.errors import UserError
    from skyrl_agent.tasks import bundled_sets, resolve_tasks
    if name is None:
        table = Table("set", "tasks")
        for set_name in bundled_sets():
            try:  # a set that needs an extra (swe-mini: swebench) must not hide the others
                count = str(len(resolve_tasks(set_name)))
            except UserError as exc:
                count = escape(f"- ({exc})")
            table.add_row(set_name, count)
        console.print(table)
        return
    table = Table("task", "category", "agent timeout", "network")
    for task in resolve_tasks(name):
        table.add_row(task.name, str(task.config.metadata.get("category", "")),
                      f"{task.agent_timeout_s:g}s", "yes" if task.network_allowed else "no")
    console.print(table)


@app.command("show")
def tasks_show(name: Annotated[str, typer.Argument(help="Task name (demo/hello-file) or path.")]
               ) -> None:
    """Show one task: its settings and its instruction."""
    from skyrl_agent.tasks import find_task
    task = find_task(name)
    env = task.config.environment
    console.print(f"[bold]{task.name}[/bold]  ({task.task_dir})")
    console.print(f"agent timeout {task.agent_timeout_s:g}s, verifier timeout "
                  f"{task.verifier_timeout_s:g}s, cpus {env.cpus or 1}, memory "
                  f"{env.memory_mb or 'default'} MB, network "
                  f"{'allowed' if task.network_allowed else 'none'}")
    console.print()
    console.print(task.instruction, markup=False)


@app.command("families")
def tasks_families() -> None:
    """List the generated task families, their difficulties and seed splits."""
    from rich.table import Table

    from skyrl_agent.tasks.families import FAMILIES, SPLITS
    table = Table("family", "what", "difficulties")
    for fam in FAMILIES.values():
        levels = "\n".join(f"{i}: {level}" for i, level in enumerate(fam.levels, 1))
        table.add_row(fam.name, fam.description, levels)
    console.print(table)
    console.print("seeds: " + ", ".join(f"{name} {seeds.start}..{seeds.stop - 1}"
                                        for name, seeds in SPLITS.items())
                  + "; as tasks: gen:FAMILY[@DIFFICULTY]:train|heldout[:COUNT] (FAMILY may be "
                  "`all` or a comma list)", markup=False)


@app.command("generate")
def tasks_generate(
    family: Annotated[str, typer.Argument(help="A family (skyrl-agent tasks families).")],
    seeds: Annotated[str, typer.Option(help="Seed range A:B (A included, B not).")],
    output: Annotated[Path, typer.Option(help="Folder for the task directories.")],
    difficulty: Annotated[int, typer.Option(min=1, help="1 = easiest.")] = 1,
) -> None:
    """Write the tasks of one family for a seed range as Harbor task directories."""
    from skyrl_agent.errors import UserError
    from skyrl_agent.tasks.families import family as family_named
    from skyrl_agent.tasks.families import split_of
    from skyrl_agent.tasks.generated import write_task

    fam = family_named(family)
    start, sep, stop = seeds.partition(":")
    if not sep or not start.isdigit() or not stop.isdigit() or int(start) >= int(stop):
        raise UserError(f"--seeds must look like A:B with A < B, got {seeds!r}")
    try:
        tasks = [fam.generate(seed, difficulty) for seed in range(int(start), int(stop))]
    except ValueError as exc:
        raise UserError(str(exc)) from None
    for task in tasks:
        directory = output / task.name.removeprefix("gen/")
        if directory.exists():
            raise UserError(f"{directory} exists; choose another --output")
    for task in tasks:
        write_task(task, output / task.name.removeprefix("gen/"))
    splits = sorted({split_of(t.name) or "" for t in tasks})
    console.print(f"{len(tasks)} tasks of {fam.name} (difficulty {difficulty}, split "
                  f"{' and '.join(splits)}) -> {output}")


@app.command("check")
def tasks_check(
    ref: Annotated[str, typer.Argument(help="A bundled set, a task dir or a dir of tasks.")],
    sandbox: Annotated[str | None, typer.Option(help="Sandbox backend: local or docker.")] = None,
    agent: Annotated[str, typer.Option(help="oracle (reference solution) or nop.")] = "oracle",
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="Tasks run at once.")] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines instead of a table.")] = False,
    expect: Annotated[float | None, typer.Option(
        help="Exit 1 unless every task's reward equals this.")] = None,
    config: ConfigOption = None,
    overrides: SetOption = None,
) -> None:
    """Run oracle or nop on tasks in sandboxes and report each task's reward."""
    from skyrl_agent.config import load_config
    from skyrl_agent.jobs.check import CheckJob

    setup_logging()
    settings = load_config(config, overrides, {"sandbox.backend": sandbox})
    job = CheckJob(settings, ref, agent, jobs)
    rewards: list[float] = []
    errors = 0

    def status(result: Any) -> str:
        nonlocal errors
        rewards.append(result.reward)
        errors += bool(result.reason)
        return f"reward {sum(rewards) / len(rewards):.2f} · errors {errors}"

    results = run_with_progress(
        job.run, total=len(job.tasks), label="checking", status=status, show=not as_json,
        on_result=(lambda r: print(json.dumps(r.to_json()), flush=True)) if as_json else None)
    if not as_json:
        _print_check_table(results)
    if expect is not None and any(r.reward != expect for r in results):
        raise typer.Exit(1)


def _print_check_table(results: list[Any]) -> None:
    from rich.table import Table
    table = Table("task", "reward", "reason")
    for r in results:
        style = "green" if r.reward == 1.0 else "red" if r.reason else "yellow"
        table.add_row(r.task, f"[{style}]{r.reward:.2f}[/{style}]", r.reason or "")
    console.print(table)
    mean = sum(r.reward for r in results) / max(1, len(results))
    errors = sum(1 for r in results if r.reason)
    console.print(f"{len(results)} tasks, mean reward {mean:.3f}, {errors} with errors")
    if results:
        console.print(
            f"median seconds: sandbox start {median([r.sandbox_time_s for r in results]):.2f}, "
            f"agent {median([r.agent_time_s for r in results]):.2f}, verification "
            f"{median([r.verify_time_s for r in results]):.2f} (in separate mode: a fresh "
            "sandbox, the artifacts restored, the tests)")
