"""What every command shares: the consoles, common options, logging, the progress display."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from skyrl_agent.stopping import run_until_stopped

console = Console(soft_wrap=True)  # piped output keeps whole lines
err_console = Console(stderr=True, soft_wrap=True)

ConfigOption = Annotated[Path | None, typer.Option("--config", "-c",
                                                   help="YAML or TOML run config.")]
SetOption = Annotated[list[str] | None, typer.Option(
    "--set", help="Override a config value: section.key=value (repeatable).")]
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(log_file: Path | None = None) -> None:
    """Warnings on stderr through rich (above any progress bar, which shares the console);
    with `log_file`, the project's info messages too, appended there."""
    from rich.logging import RichHandler

    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    root.setLevel(logging.WARNING)
    logging.getLogger("skyrl_agent").setLevel(logging.INFO)
    terminal = RichHandler(console=err_console, show_path=False, show_time=False,
                           level=logging.WARNING)
    root.addHandler(terminal)
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        to_file = logging.FileHandler(log_file, encoding="utf-8")
        to_file.setFormatter(logging.Formatter(LOG_FORMAT))
        to_file.setLevel(logging.INFO)
        root.addHandler(to_file)


def run_with_progress[T](make_coro: Callable[[Callable[[Any], None]], Coroutine[Any, Any, T]],
                      total: int, label: str, status: Callable[[Any], str],
                      on_result: Callable[[Any], None] | None = None,
                      show: bool = True) -> T:
    """Run the coroutine with a progress bar on stderr. `status(result)` is called per finished
    item and names what the bar shows. SIGTERM stops the run like Ctrl-C does (every sandbox
    is stopped on the way out) and ends in one line."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    progress = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
                        console=err_console, disable=not show, transient=True)
    bar = progress.add_task(label, total=total, status="")
    started = time.monotonic()
    done = 0

    def finished(result: Any) -> None:
        nonlocal done
        done += 1
        if on_result is not None:
            on_result(result)
        per_minute = done / max(time.monotonic() - started, 1e-6) * 60
        progress.update(bar, advance=1, status=f"{status(result)} · {per_minute:.1f}/min")

    with progress:
        return run_until_stopped(lambda: make_coro(finished))


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2] if values else 0.0
