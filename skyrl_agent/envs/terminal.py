"""A tmux session inside the sandbox: keystrokes go in, the visible pane comes out.

This is how Terminus-style agents work: the model types into a real terminal and reads the
screen, so interactive programs (editors, REPLs, pagers) behave as they would for a person.
"""

from __future__ import annotations

import asyncio
import re
import shlex
from collections.abc import Awaitable, Callable

from skyrl_agent.sandboxes.base import ExecResult, SandboxError

Exec = Callable[..., Awaitable[ExecResult]]
# Whole keystroke strings that are tmux key names rather than text to type.
_KEY_NAME = re.compile(
    r"^(?:[CMS]-\S+|Enter|Escape|Tab|BSpace|Space|Up|Down|Left|Right|Home|End|PageUp|PageDown|"
    r"PPage|NPage|DC|IC|F\d{1,2})$")


class TmuxTerminal:
    """One tmux session named `name` in the sandbox, `width` x `height` characters."""

    def __init__(self, exec_: Exec, name: str = "agent", width: int = 160, height: int = 48,
                 workdir: str | None = None) -> None:
        self._exec = exec_
        self.name = name
        self.width = width
        self.height = height
        self.workdir = workdir
        self.started = False

    async def start(self) -> None:
        found = await self._exec("command -v tmux", timeout=10)
        if found.exit_code != 0:
            raise SandboxError("tmux is not installed in this sandbox; the terminal agent needs "
                               "it (add it to the task image)")
        result = await self._exec(
            f"tmux new-session -d -s {self.name} -x {self.width} -y {self.height}",
            timeout=15, cwd=self.workdir, env={"TERM": "xterm-256color", "HISTFILE": "/dev/null"})
        if result.exit_code != 0:
            raise SandboxError(f"cannot start tmux: {result.stderr.strip()[-300:]}")
        # Keep the scroll-back bounded: capture() reads the visible pane plus some history.
        await self._tmux(f"set-option -t {self.name} history-limit 10000")
        self.started = True

    async def send_keys(self, keystrokes: str, wait_s: float = 0.0) -> None:
        """Type `keystrokes` (a newline presses Enter; a lone key name like C-c is that key),
        then wait `wait_s` seconds for the programs to react."""
        if not self.started:
            await self.start()
        if _KEY_NAME.match(keystrokes.strip()) and "\n" not in keystrokes:
            await self._tmux(f"send-keys -t {self.name} {shlex.quote(keystrokes.strip())}")
        else:
            lines = keystrokes.split("\n")
            for index, line in enumerate(lines):
                if line:
                    await self._tmux(f"send-keys -t {self.name} -l -- {shlex.quote(line)}")
                if index < len(lines) - 1:
                    await self._tmux(f"send-keys -t {self.name} Enter")
        if wait_s > 0:
            await asyncio.sleep(wait_s)

    async def capture(self, history_lines: int = 0) -> str:
        """The pane's text (plus up to `history_lines` of scroll-back), trailing blanks cut."""
        if not self.started:
            await self.start()
        start = f" -S -{history_lines}" if history_lines else ""
        result = await self._tmux(f"capture-pane -p -J -t {self.name}{start}")
        return result.stdout.rstrip() + "\n"

    async def _tmux(self, arguments: str) -> ExecResult:
        result = await self._exec(f"tmux {arguments}", timeout=15)
        if result.exit_code != 0:
            raise SandboxError(f"tmux {arguments.split()[0]} failed: "
                               f"{result.stderr.strip()[-300:]}")
        return result
