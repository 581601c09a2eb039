"""The `skyrl-agent` command line: one module per command. Heavy imports stay inside commands
so `--help` is instant.

Bad input (a config key, a task, a name) prints one `error:` line and exits with code 2; a run
that has to stop (its model server died, SIGTERM) prints one line and exits non-zero.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.markup import escape

from skyrl_agent import __version__
from skyrl_agent.cli import (
    agents,
    audit,
    demos,
    evaluate,
    recipe,
    rollout,
    serve,
    sft,
    tasks,
    tinker_serve,
    train,
)
from skyrl_agent.cli.common import console, err_console
from skyrl_agent.descriptors import prepare
from skyrl_agent.errors import RunStopped, UserError
from skyrl_agent.stopping import stop_on_sigterm

app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False,
                  help="skyrl-agent: an RL gym for LLM agents in sandboxes.")
tasks.app.command("audit")(audit.tasks_audit)
app.add_typer(tasks.app, name="tasks")
app.add_typer(agents.app, name="agents")
app.command()(rollout.rollout)
app.command("eval")(evaluate.eval_run)
app.command()(serve.serve)
app.command()(sft.sft)
app.command()(demos.demos)
app.command()(recipe.recipe)
app.command()(train.train)
app.command("tinker-serve")(tinker_serve.tinker_serve)


def _version(value: bool) -> None:
    if value:
        console.print(f"skyrl-agent {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="Print the version.")] = False) -> None:
    pass


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: user errors and stopped runs become one line."""
    stop_on_sigterm()
    prepare()  # the open-file soft limit up to the hard one, before any run or server starts
    try:
        app(args=argv)
    except UserError as exc:
        err_console.print(f"[red]error:[/red] {escape(str(exc))}", markup=True, highlight=False)
        sys.exit(2)
    except RunStopped as exc:
        err_console.print(f"[red]stopped:[/red] {escape(str(exc))}", markup=True,
                          highlight=False)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err_console.print("interrupted; work already stored is kept")
        sys.exit(130)

