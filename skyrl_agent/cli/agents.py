"""`skyrl-agent agents ...`: the agents installed as plug-ins."""

from __future__ import annotations

import typer

from skyrl_agent.cli.common import console

app = typer.Typer(no_args_is_help=True, help="Agents installed as plug-ins.")


@app.command("list")
def agents_list() -> None:
    """List the agents registered under the `skyrl_agent.agents` entry-point group."""
    from rich.markup import escape
    from rich.table import Table

    from skyrl_agent import plugins
    from skyrl_agent.agents.base import agent_class
    table = Table("agent", "needs a model", "description")
    for name in plugins.available(plugins.AGENTS):
        try:
            cls = agent_class(name)
        except Exception as exc:  # noqa: BLE001 - a broken plug-in must not hide the others
            table.add_row(name, "?", f"[red]cannot load: {escape(str(exc))}[/red]")
            continue
        doc = (cls.__doc__ or "").strip().splitlines()
        table.add_row(name, "yes" if cls.needs_model else "no", doc[0] if doc else "")
    console.print(table)
