"""`skyrl-agent eval RUN_DIR`: judge stored trajectories without re-running agents."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from skyrl_agent.cli.common import console, err_console, setup_logging

if TYPE_CHECKING:
    from skyrl_agent.evaluation.regrade import Regrade
    from skyrl_agent.evaluation.run import Decode
    from skyrl_agent.evaluation.stats import RunSummary
    from skyrl_agent.types import Trajectory


def eval_run(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by rollout or train.")],
    compare_to: Annotated[Path | None, typer.Option(
        "--compare", help="A second run: per-task rewards side by side.")] = None,
    regrade: Annotated[bool, typer.Option(
        help="Re-run each task's tests in a fresh sandbox on the stored final state.")] = False,
    html: Annotated[Path | None, typer.Option(help=(
        "Write a self-contained HTML report: charts (pass@k, reward per task, turns and tokens; "
        "a training run's curves) and a trajectory viewer."))] = None,
    atif: Annotated[Path | None, typer.Option(
        help="Export every trajectory as Harbor ATIF JSON into this folder.")] = None,
    hacks: Annotated[bool, typer.Option(help=(
        "The hack rate: rewarded trajectories whose actions touch the grader (/tests, "
        "/logs/verifier, /solution, git history) or, with --regrade, whose re-grade is lower."))]
        = False,
    sandbox: Annotated[str | None, typer.Option(help="Sandbox backend for --regrade.")] = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="Re-grades run at once.")]
        = 2,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Statistics of stored trajectories: reward, pass@k, per task, finish reasons, tokens."""
    from skyrl_agent.evaluation.run import decoder, load_run, run_model
    from skyrl_agent.evaluation.stats import summarize

    setup_logging()
    trajectories = load_run(run_dir)
    summary = summarize(trajectories)
    if as_json:
        print(json.dumps(dataclasses.asdict(summary)))
    else:
        print_summary(summary, str(run_dir))
    if compare_to is not None:
        other = summarize(load_run(compare_to))
        print_comparison(summary, other, (str(run_dir), str(compare_to)))
    regrades = print_regrades(trajectories, run_dir, sandbox, jobs) if regrade else []
    decode = decoder(run_dir) if html is not None or atif is not None or hacks else None
    if hacks:
        print_hacks(trajectories, decode, regrades)
    if html is not None or atif is not None:
        if html is not None:
            from skyrl_agent.evaluation.curves import training_series
            from skyrl_agent.evaluation.html import write_report
            write_report(html, summary, trajectories, f"skyrl-agent run {run_dir}", decode,
                         training_series(run_dir))
            err_console.print(f"report: {html}")
        if atif is not None:
            from skyrl_agent.evaluation.atif import export_atif
            paths = export_atif(trajectories, atif, decode or (lambda ids: ""), run_model(run_dir))
            err_console.print(f"{len(paths)} ATIF trajectories in {atif}")


def print_summary(summary: RunSummary, title: str) -> None:
    from skyrl_agent.evaluation.stats import describe_time

    pass_at = "".join(f"pass@{k} {v:.3f}{_over(summary, k)}, " for k, v in summary.pass_at.items())
    console.print(f"[bold]{title}[/bold]: {summary.trajectories} trajectories, {summary.tasks} "
                  f"tasks, reward mean {summary.reward_mean:.3f}, {pass_at}"
                  f"masked {summary.masked}", highlight=False)
    console.print(f"turns {summary.turns_mean:.1f}, prompt tokens {summary.prompt_tokens_mean:.0f}"
                  f", completion tokens {summary.completion_tokens_mean:.0f}, summaries "
                  f"{summary.summaries_total}, drift tokens {summary.drift_tokens_mean:.1f}; "
                  f"finish reasons {summary.finish_reasons}", highlight=False)
    if summary.impossible_twins:
        console.print(f"impossible twins: {summary.impossible_twins} samples (left out above), "
                      f"impossible twin rate {summary.impossible_twin_rate:.3f}: the share "
                      "that earned a reward, each one forged", highlight=False)
    if summary.unscored_tasks:
        console.print(f"left out of pass@k: {summary.unscored_tasks} of {summary.tasks} tasks "
                      "with every sample masked", highlight=False)
    console.print(f"seconds per trajectory: {describe_time(summary.time_account)}",
                  highlight=False)
    table = Table("task", "samples", "passed", "reward mean", "masked", "turns")
    for row in summary.per_task:
        table.add_row(row.task_id, str(row.samples), str(row.passed), f"{row.reward_mean:.3f}",
                      str(row.masked), f"{row.turns_mean:.1f}")
    console.print(table)


def _over(summary: RunSummary, k: int) -> str:
    """` (over N of M tasks)` when pass@k leaves out scored tasks (fewer than k unmasked
    samples); the fully masked ones are said once, apart."""
    counted, scored = summary.pass_at_tasks[k], summary.tasks - summary.unscored_tasks
    return "" if counted == scored else f" (over {counted} of {scored} tasks)"


def print_comparison(a: RunSummary, b: RunSummary, names: tuple[str, str]) -> None:
    from skyrl_agent.evaluation.stats import compare
    table = Table("task", names[0], names[1], "change")
    for delta in compare(a, b):
        change = ("" if delta.reward_a is None or delta.reward_b is None
                  else f"{delta.reward_b - delta.reward_a:+.3f}")
        table.add_row(delta.task_id, *(f"{r:.3f}" if r is not None else "-"
                                       for r in (delta.reward_a, delta.reward_b)), change)
    console.print(table)
    console.print(f"reward mean {a.reward_mean:.3f} -> {b.reward_mean:.3f} "
                  f"({b.reward_mean - a.reward_mean:+.3f})")


def print_regrades(trajectories: list[Trajectory], run_dir: Path, sandbox: str | None,
                   jobs: int) -> list[Regrade]:
    from skyrl_agent.config import SandboxConfig
    from skyrl_agent.evaluation.regrade import regrade
    from skyrl_agent.evaluation.run import run_tasks

    config = SandboxConfig(backend=sandbox) if sandbox else SandboxConfig()
    results = asyncio.run(regrade(trajectories, run_dir, config, jobs, run_tasks(run_dir)))
    table = Table("task", "sample", "stored", "regraded", "note")
    for r in results:
        regraded = "-" if r.regraded is None else f"{r.regraded:.3f}"
        table.add_row(r.task_id, str(r.sample_index), f"{r.stored:.3f}", regraded, r.note)
    console.print(table)
    same = sum(1 for r in results if r.regraded is not None and r.regraded == r.stored)
    done = sum(1 for r in results if r.regraded is not None)
    console.print(f"re-graded {done} of {len(results)}; {same} agree with the stored reward")
    return results


def print_hacks(trajectories: list[Trajectory], decode: Decode | None,
                regrades: list[Regrade]) -> None:
    from skyrl_agent.evaluation.hacks import hack_report

    report = hack_report(trajectories, decode, regrades)
    checks = [name for name, done in (("re-grades", report.regraded),
                                      ("actions", report.read_actions)) if done]
    console.print(f"hack rate {report.rate:.3f}: {len(report.flagged)} of {report.rewarded} "
                  f"rewarded trajectories flagged (checked: {', '.join(checks) or 'nothing'}), "
                  f"{len(report.tampered)} scored 0 as tampering")
    if report.flagged or report.tampered:
        table = Table("task", "sample", "why")
        for flag in [*report.flagged, *report.tampered]:
            table.add_row(flag.task_id, str(flag.sample_index), "; ".join(flag.reasons))
        console.print(table)
