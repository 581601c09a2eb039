"""Env: a task bound to a sandbox, the only world an agent acts in."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from skyrl_agent.envs.verifier import verify
from skyrl_agent.sandboxes.base import ExecResult, Sandbox
from skyrl_agent.tasks.model import TaskSpec
from skyrl_agent.types import Reward


class Env:
    """What an agent may do: read the instruction, run commands, move files. Then verify()."""

    def __init__(self, task: TaskSpec, sandbox: Sandbox) -> None:
        self.task = task
        self.sandbox = sandbox

    @property
    def instruction(self) -> str:
        return self.task.instruction

    @property
    def workdir(self) -> str:
        return self.sandbox.spec.workdir

    async def exec(self, command: str, timeout: float | None = None, cwd: str | None = None,
                   env: Mapping[str, str] | None = None) -> ExecResult:
        """Run a shell command as the task's agent user."""
        return await self.sandbox.exec(command, timeout=timeout, cwd=cwd, env=env,
                                       user=self.task.config.agent.user)

    async def upload(self, local: Path, remote: str) -> None:
        await self.sandbox.upload(local, remote)

    async def download(self, remote: str, local: Path) -> None:
        await self.sandbox.download(remote, local)

    async def verify(self) -> Reward:
        """Run the task's tests (copied in only now) and read the reward."""
        return await verify(self.sandbox, self.task)
