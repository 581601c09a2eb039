"""`skyrl-agent tasks audit`: which tasks can be gamed by the built-in adversaries."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from skyrl_agent.cli.common import (
    ConfigOption,
    SetOption,
    console,
    run_with_progress,
    setup_logging,
)


def tasks_audit(
    ref: Annotated[str, typer.Argument(help="A bundled set, a task dir or a dir of tasks.")],
    sandbox: Annotated[str | None, typer.Option(help="Sandbox backend: local or docker.")] = None,
    attack: Annotated[list[str] | None, typer.Option(
        help="Run only this attack (repeatable); default: all of them.")] = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="Episodes run at once.")] = 2,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines instead of a table.")] = False,
    config: ConfigOption = None,
    overrides: SetOption = None,
) -> None:
    """Run every built-in adversary (forged reward files, lurking rewriters, planted tests,
    Python start-up hooks, import-time forgers, git hooks, solution hunting, ...) on each task
    and report the tasks where one scores more than doing nothing. Exits 1 if any can be gamed."""
    from skyrl_agent.config import load_config
    from skyrl_agent.jobs.check import AuditJob

    setup_logging()
    settings = load_config(config, overrides, {"sandbox.backend": sandbox})
    job = AuditJob(settings, ref, attack, jobs)
    gamed = 0

    def status(result: Any) -> str:
        nonlocal gamed
        gamed += bool(result.gameable_by)
        return f"gameable {gamed}"

    results = run_with_progress(
        job.run, total=len(job.tasks), label="auditing", status=status, show=not as_json,
        on_result=(lambda r: print(json.dumps(r.to_json()), flush=True)) if as_json else None)
    if not as_json:
        _print_table(results, job.attacks)
    if any(r.gameable_by for r in results):
        raise typer.Exit(1)


def _print_table(results: list[Any], names: list[str]) -> None:
    from rich.table import Table

    table = Table("task", "nop", "gameable by", "errors")
    for r in results:
        errors = sum(1 for x in [r.baseline, *r.attacks.values()] if x.reason and x.reward == 0)
        gamed = ", ".join(f"{n} ({r.attacks[n].reward:.2f})" for n in r.gameable_by)
        table.add_row(r.task, f"{r.baseline.reward:.2f}", f"[red]{gamed}[/red]" if gamed else "-",
                      str(errors))
    console.print(table)
    bad = [r.task for r in results if r.gameable_by]
    console.print(f"{len(results)} tasks x {len(names)} attacks: {len(bad)} gameable"
                  + (f" ({', '.join(bad)})" if bad else ""))
