"""Env: a task bound to a sandbox, the only world an agent acts in."""

from __future__ import annotations

import base64
import contextlib
import os
import posixpath
import shlex
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from skyrl_agent.envs.terminal import TmuxTerminal
from skyrl_agent.model.vision import MAX_IMAGE_BYTES, decode_image
from skyrl_agent.sandboxes.base import ExecResult, Sandbox, SandboxError
from skyrl_agent.tasks.spec import IMAGE_LINK, TaskSpec

_INLINE_WRITE_LIMIT = 64 * 1024  # larger files go through upload (tar) instead of the command line


class Env:
    """What an agent may do: read the instruction, run commands, read and write files, use a
    terminal (tmux) in the sandbox. Verification is not its business: see episode.py."""

    def __init__(self, task: TaskSpec, sandbox: Sandbox) -> None:
        self.task = task
        self.sandbox = sandbox
        self._terminal: TmuxTerminal | None = None
        self._sandbox_s = 0.0

    @property
    def exec_time_s(self) -> float:
        """Seconds the agent's commands and file operations took in the sandbox, and its
        terminal waited for programs to react (the exec bucket of the time account)."""
        return self._sandbox_s + (self._terminal.waited_s if self._terminal else 0.0)

    @contextlib.contextmanager
    def _timed(self) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self._sandbox_s += time.monotonic() - started

    @property
    def instruction(self) -> str:
        return self.task.instruction

    def instruction_parts(self) -> list[str | bytes]:
        """The instruction as text pieces and the images it links (bytes), in order: each
        `![text](picture.png)` the task ships becomes that picture."""
        shipped = dict(self.task.instruction_images)
        parts: list[str | bytes] = []
        at = 0
        text = self.task.instruction.strip()
        for link in IMAGE_LINK.finditer(text):
            if link.group(1) in shipped:
                parts += [text[at : link.start()], shipped[link.group(1)]]
                at = link.end()
        parts.append(text[at:])
        return [part for part in parts if part != ""]

    async def read_image(self, path: str) -> bytes:
        """A PNG or JPEG file of the sandbox, checked before any model sees it (ImageError:
        not an image we read; FileNotFoundError: missing or not a regular file)."""
        with self._timed():
            data = await self.sandbox.read_file(posixpath.join(self.workdir, path),
                                                limit=MAX_IMAGE_BYTES)
        if data is None:
            raise FileNotFoundError(path)
        decode_image(data)
        return data

    @property
    def workdir(self) -> str:
        return self.sandbox.spec.workdir

    async def exec(self, command: str, timeout: float | None = None, cwd: str | None = None,
                   env: Mapping[str, str] | None = None) -> ExecResult:
        """Run a shell command as the task's agent user."""
        with self._timed():
            return await self.sandbox.exec(command, timeout=timeout, cwd=cwd, env=env,
                                           user=self.task.config.agent.user)

    @property
    def terminal(self) -> TmuxTerminal:
        """The sandbox's tmux session (started on first use), in the task's workdir."""
        if self._terminal is None:
            self._terminal = TmuxTerminal(self.exec, workdir=self.workdir)
        return self._terminal

    async def read_file(self, path: str) -> str:
        """A text file's whole content; FileNotFoundError when it is missing or not a file.

        Read by the host, not with `cat`: command output is cut at max_output_bytes, and an
        editor that wrote a cut file back would corrupt it."""
        with self._timed():
            data = await self.sandbox.read_file(posixpath.join(self.workdir, path))
        if data is None:
            raise FileNotFoundError(path)
        return data.decode(errors="replace")

    async def write_file(self, path: str, content: str) -> None:
        """Create or replace a file (parent folders are created; an existing file keeps its
        mode)."""
        data = content.encode()
        if len(data) <= _INLINE_WRITE_LIMIT:
            quoted = shlex.quote(path)
            encoded = base64.b64encode(data).decode()
            result = await self.exec(
                f"mkdir -p -- \"$(dirname -- {quoted})\" && "
                f"printf %s {encoded} | base64 -d > {quoted}",
                timeout=30, cwd=self.workdir)
            if result.exit_code != 0:
                raise SandboxError(f"cannot write {path}: {result.stderr.strip()[-300:]}")
            return
        with tempfile.TemporaryDirectory() as scratch:
            local = Path(scratch) / "file"
            local.write_bytes(data)
            os.chmod(local, 0o644)
            await self.upload(local, posixpath.join(self.workdir, path))

    async def upload(self, local: Path, remote: str) -> None:
        with self._timed():
            await self.sandbox.upload(local, remote)

    async def upload_task_folder(self, rel: str, remote: str) -> None:
        """Copy a folder of the task (e.g. `solution`) to `remote`, each file read as
        tasks/files.py reads task files (no links, no hard links)."""
        with self._timed():
            await self.sandbox.upload_task_folder(self.task.task_dir, rel, remote)
