"""A tmux session inside the sandbox: keystrokes go in, the visible pane comes out.

This is how Terminus-style agents work: the model types into a real terminal and reads the
screen, so interactive programs (editors, REPLs, pagers) behave as they would for a person.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import time
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
        self.waited_s = 0.0
        """Seconds spent waiting for programs in the terminal to react (the agent's waits and
        the shell's first prompt)."""

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
        self.started = True
        await self._wait_for_prompt()

    async def _wait_for_prompt(self, timeout_s: float = 5.0) -> None:
        """Wait until the shell has drawn its prompt, so the first screen an agent sees does not
        depend on how fast the shell started (same task, same first observation)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while asyncio.get_running_loop().time() < deadline:
            if (await self._tmux(f"capture-pane -p -t {self.name}")).stdout.strip():
                return
            await self._wait(0.02)

    async def send_keys(self, keystrokes: str, wait_s: float = 0.0) -> None:
        """Type `keystrokes` (a newline presses Enter; a lone key name like C-c is that key),
        then wait `wait_s` seconds for the programs to react."""
        if not self.started:
            await self.start()
        if _KEY_NAME.match(keystrokes.strip()) and "\n" not in keystrokes:
            await self._tmux(f"send-keys -t {self.name} {shlex.quote(keystrokes.strip())}")
        else:  # one tmux call: literal text per line, Enter between lines
            parts = []
            lines = keystrokes.split("\n")
            for index, line in enumerate(lines):
                if line:
                    parts.append(f"send-keys -t {self.name} -l -- {shlex.quote(_literal(line))}")
                if index < len(lines) - 1:
                    parts.append(f"send-keys -t {self.name} Enter")
            if parts:
                await self._tmux(" \\; ".join(parts))
        if wait_s > 0:
            await self._wait(wait_s)

    async def _wait(self, seconds: float) -> None:
        started = time.monotonic()
        await asyncio.sleep(seconds)
        self.waited_s += time.monotonic() - started

    async def capture(self) -> str:
        """The visible pane's text, trailing blanks cut."""
        if not self.started:
            await self.start()
        result = await self._tmux(f"capture-pane -p -J -t {self.name}")
        return result.stdout.rstrip() + "\n"

    async def _tmux(self, arguments: str) -> ExecResult:
        result = await self._exec(f"tmux {arguments}", timeout=15)
        if result.exit_code != 0:
            raise SandboxError(f"tmux {arguments.split()[0]} failed: "
                               f"{result.stderr.strip()[-300:]}")
        return result


def _literal(text: str) -> str:
    """tmux ends a command at an argument's trailing `;` and strips one backslash before it, so
    a line ending in `;` (or `\\;`, as in `find -exec ... \\;`) gets one more backslash."""
    return f"{text[:-1]}\\;" if text.endswith(";") else text
