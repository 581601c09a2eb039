"""One of our sandboxes as a Harbor environment, so Harbor's agents act in it.

Harbor agents (terminus-2 and the others) talk to a `harbor.environments.base.BaseEnvironment`.
This one forwards exec and file transfer to a sandbox the episode already started; start and
stop are the episode's business, so they do nothing here.
"""

from __future__ import annotations

import asyncio
import shlex
import tempfile
from pathlib import Path
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.models.trial.paths import TrialPaths

from skyrl_agent.envs.env import Env

ENVIRONMENT_TYPE = "skyrl-agent"


class SandboxEnvironment(BaseEnvironment):
    """A Harbor environment over an episode's started sandbox."""

    def __init__(self, env: Env, trial_dir: Path, **kwargs: Any) -> None:
        self.env = env
        task = env.task
        super().__init__(environment_dir=task.task_dir / "environment",
                         environment_name=task.name.replace("/", "__"),
                         session_id=f"{task.name.replace('/', '__')}__env",
                         trial_paths=TrialPaths(trial_dir=trial_dir),
                         task_env_config=task.config.environment, **kwargs)
        self.default_user = task.config.agent.user

    @staticmethod
    def type() -> str:
        return ENVIRONMENT_TYPE

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(disable_internet=True)

    def _validate_definition(self) -> None:
        """The episode built the sandbox from the task; nothing to check here."""

    async def start(self, force_build: bool) -> None:
        """The episode started the sandbox."""

    async def stop(self, delete: bool) -> None:
        """The episode stops the sandbox (after killing what the agent left)."""

    async def exec(self, command: str, cwd: str | None = None, env: dict[str, str] | None = None,
                   timeout_sec: int | None = None, user: str | int | None = None,
                   **kwargs: Any) -> ExecResult:
        result = await self.env.sandbox.exec(
            command, timeout=timeout_sec, cwd=cwd or self.env.workdir,
            env=self._merge_env(env), user=self._resolve_user(user))
        return ExecResult(stdout=result.stdout, stderr=result.stderr,
                          return_code=result.exit_code)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        await self.env.sandbox.upload(Path(source_path), target_path)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        await self.env.sandbox.upload(Path(source_dir), target_dir)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        data = await self.env.sandbox.read_file(source_path)
        if data is None:
            raise FileNotFoundError(source_path)
        await asyncio.to_thread(_write, Path(target_path), data)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        # The host never unpacks what a sandbox made: regular files are read one by one.
        listing = await self.env.sandbox.exec(
            f"cd {shlex.quote(source_dir)} && find . -type f -print0", timeout=60)
        for name in filter(None, listing.stdout.split("\0")):
            relative = Path(name).relative_to(".")
            if ".." in relative.parts:
                continue
            await self.download_file(f"{source_dir.rstrip('/')}/{relative}",
                                     Path(target_dir) / relative)


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def scratch_dir() -> tempfile.TemporaryDirectory[str]:
    """A host folder for a Harbor agent's own logs (deleted after the episode)."""
    return tempfile.TemporaryDirectory(prefix="skyrl-harbor-agent-")

