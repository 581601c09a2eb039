"""The `skyrl-agent` command line. Heavy imports stay inside commands so `--help` is instant.

Bad input (a config key, a task, a name) prints one `error:` line and exits with code 2.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from skyrl_agent import __version__
from skyrl_agent.errors import UserError

app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False,
                  help="skyrl-agent: an RL gym for LLM agents in sandboxes.")
tasks_app = typer.Typer(no_args_is_help=True, help="Inspect and check Harbor-format task sets.")
app.add_typer(tasks_app, name="tasks")
agents_app = typer.Typer(no_args_is_help=True, help="Agents installed as plug-ins.")
app.add_typer(agents_app, name="agents")
console = Console(soft_wrap=True)  # piped output keeps whole lines
err_console = Console(stderr=True, soft_wrap=True)

ConfigOption = Annotated[Path | None, typer.Option("--config", "-c",
                                                   help="YAML or TOML run config.")]
SetOption = Annotated[list[str] | None, typer.Option(
    "--set", help="Override a config value: section.key=value (repeatable).")]


def _version(value: bool) -> None:
    if value:
        console.print(f"skyrl-agent {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="Print the version.")] = False) -> None:
    pass


@tasks_app.command("list")
def tasks_list(name: Annotated[str | None, typer.Argument(
        help="A task set or path; without it, the bundled sets.")] = None) -> None:
    """List bundled task sets, or the tasks of one set."""
    from rich.table import Table

    from skyrl_agent.tasks import bundled_sets, resolve_tasks
    if name is None:
        table = Table("set", "tasks")
        for set_name in bundled_sets():
            table.add_row(set_name, str(len(resolve_tasks(set_name))))
        console.print(table)
        return
    table = Table("task", "category", "agent timeout", "network")
    for task in resolve_tasks(name):
        table.add_row(task.name, str(task.config.metadata.get("category", "")),
                      f"{task.agent_timeout_s:g}s", "yes" if task.network_allowed else "no")
    console.print(table)


@tasks_app.command("show")
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


@tasks_app.command("check")
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
    from skyrl_agent.sandboxes.base import sandbox_backend
    from skyrl_agent.tasks import resolve_tasks
    from skyrl_agent.tasks.check import check_tasks

    settings = load_config(config, [*(overrides or []),
                                    *([f"sandbox.backend={sandbox}"] if sandbox else [])])
    sandbox_backend(settings.sandbox.backend)  # unknown backend: one line, before any work
    tasks = resolve_tasks(ref, settings.tasks.include, settings.tasks.limit)
    from skyrl_agent.sandboxes.reaper import reap_leftovers
    reap_leftovers(settings.sandbox)
    results = _run_with_progress(
        lambda on_result: check_tasks(tasks, agent, settings.sandbox, jobs=jobs,
                                      verifier=settings.verifier, on_result=on_result),
        total=len(tasks), as_json=as_json)
    if not as_json:
        _print_check_table(results)
    if expect is not None and any(r.reward != expect for r in results):
        raise typer.Exit(1)


def _run_with_progress(make_coro, total: int, as_json: bool, label: str = "checking"):
    """Run the coroutine with a progress bar on stderr (JSON lines, if asked, go to stdout)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    progress = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
                        console=err_console, disable=as_json, transient=True)
    bar = progress.add_task(label, total=total, status="")
    rewards: list[float] = []
    errors = 0
    started = time.monotonic()

    def on_result(result) -> None:
        nonlocal errors
        if as_json:
            print(json.dumps(result.to_json()), flush=True)
        rewards.append(result.reward if isinstance(result.reward, float) else result.reward.value)
        errors += bool(getattr(result, "masked", False) or getattr(result, "reason", None))
        per_minute = len(rewards) / max(time.monotonic() - started, 1e-6) * 60
        progress.update(bar, advance=1, status=(
            f"reward {sum(rewards) / len(rewards):.2f} · errors {errors} · "
            f"{per_minute:.1f}/min"))

    async def runner():
        # SIGTERM cancels the run like Ctrl-C does, so every sandbox is stopped on the way out.
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)
        return await make_coro(on_result)

    with progress:
        return asyncio.run(runner())


def _print_check_table(results) -> None:
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
        def median(values: list[float]) -> float:
            return sorted(values)[len(values) // 2]
        console.print(
            f"median seconds: sandbox start {median([r.sandbox_time_s for r in results]):.2f}, "
            f"agent {median([r.agent_time_s for r in results]):.2f}, verification "
            f"{median([r.verify_time_s for r in results]):.2f} (in separate mode: a fresh "
            "sandbox, the artifacts restored, the tests)")


@agents_app.command("list")
def agents_list() -> None:
    """List the agents registered under the `skyrl_agent.agents` entry-point group."""
    from rich.table import Table

    from skyrl_agent import plugins
    from skyrl_agent.agents.base import agent_class
    table = Table("agent", "needs a model", "description")
    for name in plugins.available(plugins.AGENTS):
        try:
            cls = agent_class(name)
        except Exception as exc:  # noqa: BLE001 - a broken plug-in must not hide the others
            table.add_row(name, "?", f"[red]cannot load: {exc}[/red]")
            continue
        doc = (cls.__doc__ or "").strip().splitlines()
        table.add_row(name, "yes" if cls.needs_model else "no", doc[0] if doc else "")
    console.print(table)


@app.command()
def rollout(
    agent: Annotated[str, typer.Option(help="A registered agent (skyrl-agent agents list).")]
        = "terminus",
    tasks: Annotated[str, typer.Option(help="A bundled set, a task dir or a dir of tasks.")]
        = "demo",
    n: Annotated[int, typer.Option("--n", min=1, help="Samples per task.")] = 1,
    output: Annotated[Path, typer.Option(help="Run directory for the trajectories.")]
        = Path("runs/rollout"),
    endpoint: Annotated[str | None, typer.Option(
        help="A running OpenAI-compatible server; default: start the embedded one.")] = None,
    sandbox: Annotated[str | None, typer.Option(help="Sandbox backend: local or docker.")] = None,
    jobs: Annotated[int | None, typer.Option("--jobs", "-j", min=1, help=(
        "Rollouts run at once (collector.max_concurrent_sandboxes)."))] = None,
    config: ConfigOption = None,
    overrides: SetOption = None,
) -> None:
    """Run an agent on tasks with a model and store token-level trajectories in a run dir.

    Running it again on the same --output resumes: stored samples are skipped."""
    from skyrl_agent.collector.run import rollout_command
    flags = [f"agent.name={agent}", f"tasks.source={tasks}"]
    flags += [f"inference.endpoint={endpoint}"] if endpoint else []
    flags += [f"sandbox.backend={sandbox}"] if sandbox else []
    flags += [f"collector.max_concurrent_sandboxes={jobs}"] if jobs else []
    trajectories = rollout_command(
        config, [*flags, *(overrides or [])], n, output,
        lambda make, total: _run_with_progress(make, total, False, label="rollouts"))
    _print_rollout_table(trajectories, output)


def _print_rollout_table(trajectories, output: Path) -> None:
    from rich.table import Table
    table = Table("task", "sample", "reward", "finish", "turns", "note")
    for t in trajectories:
        table.add_row(t.task_id, str(t.sample_index), f"{t.reward.value:.2f}", t.finish_reason,
                      str(t.num_turns), t.mask_reason or t.reward.reason or "")
    console.print(table)
    mean = sum(t.reward.value for t in trajectories) / max(1, len(trajectories))
    console.print(f"{len(trajectories)} trajectories, mean reward {mean:.3f} -> {output}")


@app.command("eval")
def eval_run(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by rollout or train.")],
    compare_to: Annotated[Path | None, typer.Option(
        "--compare", help="A second run: per-task rewards side by side.")] = None,
    regrade: Annotated[bool, typer.Option(
        help="Re-run each task's tests in a fresh sandbox on the stored final state.")] = False,
    html: Annotated[Path | None, typer.Option(help="Write a self-contained HTML report.")]
        = None,
    atif: Annotated[Path | None, typer.Option(
        help="Export every trajectory as Harbor ATIF JSON into this folder.")] = None,
    sandbox: Annotated[str | None, typer.Option(help="Sandbox backend for --regrade.")] = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="Re-grades run at once.")]
        = 2,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Statistics of stored trajectories: reward, pass@k, per task, finish reasons, tokens."""
    import dataclasses

    from skyrl_agent.evaluation import command
    from skyrl_agent.evaluation.stats import summarize
    trajectories = command.load_run(run_dir, err_console)
    summary = summarize(trajectories)
    if as_json:
        print(json.dumps(dataclasses.asdict(summary)))
    else:
        command.print_summary(summary, console, str(run_dir))
    if compare_to is not None:
        other = summarize(command.load_run(compare_to, err_console))
        command.print_comparison(summary, other, (str(run_dir), str(compare_to)), console)
    if regrade:
        command.print_regrades(trajectories, run_dir, sandbox, jobs, console)
    if html is not None or atif is not None:
        decode = command.decoder(run_dir, err_console)
        if html is not None:
            from skyrl_agent.evaluation.html import write_report
            write_report(html, summary, trajectories, f"skyrl-agent run {run_dir}", decode)
            err_console.print(f"report: {html}")
        if atif is not None:
            from skyrl_agent.evaluation.atif import export_atif
            paths = export_atif(trajectories, atif, decode or (lambda ids: ""),
                                command.run_model(run_dir))
            err_console.print(f"{len(paths)} ATIF trajectories in {atif}")


@app.command()
def serve(
    model: Annotated[str, typer.Option(help="Built-in model name or local Hugging Face folder.")]
        = "smollm2-135m",
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port; 0 picks a free one (printed on stdout).")] = 8000,
    served_model_name: Annotated[str | None, typer.Option(
        help="Name clients send as `model` (default: --model).")] = None,
    max_batch_size: Annotated[int, typer.Option(min=1, help="Most sequences decoded together.")]
        = 32,
    max_model_len: Annotated[int | None, typer.Option(min=16, help="Context length cap.")] = None,
    dtype: Annotated[str, typer.Option(help="Weights dtype: float32 or bfloat16.")] = "float32",
) -> None:
    """Serve a model over HTTP with vLLM's OpenAI-compatible API (the embedded CPU server)."""
    from skyrl_agent.inference.server.main import ServeOptions, run
    run(ServeOptions(model=model, host=host, port=port, served_model_name=served_model_name,
                     max_batch_size=max_batch_size, max_model_len=max_model_len, dtype=dtype))


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: user errors become one line and exit code 2."""
    try:
        app(args=argv)
    except UserError as exc:
        err_console.print(f"[red]error:[/red] {exc}", markup=True, highlight=False)
        sys.exit(2)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
