"""The Sandbox protocol: where agent commands and task tests run.

One small async ABC (in the spirit of Harbor's BaseEnvironment). Implementations live beside it
and register under the entry-point group `skyrl_agent.sandboxes`: `local` (bubblewrap) and
`docker`. Every backend must: start from the task's environment, give no network unless the task
allows it, see no host secrets or host environment, and kill everything it started at its
deadline or at stop().
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shlex
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from stat import S_ISREG
from types import MappingProxyType
from typing import Self

from skyrl_agent import plugins
from skyrl_agent.config import SandboxConfig
from skyrl_agent.errors import TaskError, UserError
from skyrl_agent.sandboxes.archive import pack
from skyrl_agent.sandboxes.artifacts import BundleWriter
from skyrl_agent.sandboxes.dockerfile import final_workdir, parse_dockerfile
from skyrl_agent.tasks.files import pack_task_folder, read_task_text
from skyrl_agent.tasks.spec import TaskSpec

DEFAULT_MEMORY_MB = 2048
DEFAULT_STORAGE_MB = 10240
FILE_READ_LIMIT = 64 * 1024 * 1024
DEADLINE_MARGIN_S = 60.0


class SandboxError(Exception):
    """The sandbox failed in a way the host can pin on infrastructure (it did not start, the
    engine failed, it passed its deadline): retried, then masked."""


class SandboxDied(SandboxError):
    """The sandbox's processes ended while it was in use. Whatever ran inside can cause that (an
    agent can kill its own exec server or container), so it is the agent's failure when it
    happens under the agent, never a reason to retry."""


class UnsupportedEnvironment(UserError):
    """The task's environment asks for something this backend cannot provide."""


@dataclass(frozen=True)
class ExecResult:
    """What one command did."""

    exit_code: int
    """The command's exit status (-1 when it was killed at its timeout)."""
    stdout: str
    """Standard output, decoded as UTF-8 (invalid bytes replaced), cut to max_output_bytes."""
    stderr: str
    """Standard error, likewise."""
    timed_out: bool = False
    """True when the command was killed at its timeout."""
    duration_s: float = 0.0
    """Wall time of the command."""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


_RUN_PRIVATE = (tempfile.gettempdir(), "/dev/shm")
"""Where the run keeps what no sandbox may reach: vLLM's socket folder (mode 0700, which a
Docker sandbox's root ignores: containers keep CAP_DAC_OVERRIDE), trainers' weight files."""


def _holds(host: str, private: str) -> bool:
    """Whether mounting `host` shows `private` (the folder itself or one above it)."""
    return Path(os.path.realpath(private)).is_relative_to(os.path.realpath(host))


@dataclass(frozen=True)
class SandboxSpec:
    """Everything a backend needs to create one sandbox; built from a task plus the run config."""

    name: str
    """A label (the task name), used in names of containers and cgroups."""
    environment_dir: Path | None
    """The task's environment/ folder: Dockerfile and the files its COPY lines name."""
    docker_image: str | None = None
    """A prebuilt image (task.toml `docker_image`) instead of a Dockerfile."""
    workdir: str = "/"
    """Where commands run by default (task.toml `workdir`, else the Dockerfile's WORKDIR)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment of every command (task.toml `[environment] env`); nothing from the host."""
    network: bool = False
    """Whether the sandbox may reach the network."""
    memory_mb: int = DEFAULT_MEMORY_MB
    cpus: float = 1.0
    pids_limit: int = 512
    storage_mb: int = DEFAULT_STORAGE_MB
    """Disk the sandbox may fill (task.toml `storage_mb`)."""
    deadline_s: float = 3600.0
    """Lifetime: at this many seconds after start everything in the sandbox is killed."""
    max_output_bytes: int = 1_000_000
    read_only_mounts: Mapping[str, str] = field(default_factory=dict)
    """Sandbox path -> host folder, bound read-only: programs the agent runs that would
    otherwise be installed over the network (e.g. a Harbor agent's toolchain)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        object.__setattr__(self, "read_only_mounts", MappingProxyType(dict(self.read_only_mounts)))
        for inside, host in self.read_only_mounts.items():
            if not (inside.startswith("/") and os.path.isabs(host)) or ".." in inside.split("/"):
                raise ValueError(f"a read-only mount needs absolute paths, not {inside}={host}")
            if any(_holds(host, private) for private in _RUN_PRIVATE):
                raise ValueError(f"a read-only mount of {host} would show the sandbox the run's "
                                 "own sockets and weight files (the temporary and shared-memory "
                                 "folders); mount a folder below them")

    @property
    def dockerfile(self) -> Path | None:
        if self.environment_dir is None:
            return None
        path = self.environment_dir / "Dockerfile"
        return path if path.is_file() else None

    def dockerfile_text(self) -> str:
        """The Dockerfile, read as every task file is (tasks/files.py): a link or a hard link
        in its place is the task's defect (UnsupportedEnvironment), never a file to follow."""
        if self.environment_dir is None:
            raise UnsupportedEnvironment(f"task {self.name} has no environment/")
        try:
            return read_task_text(self.environment_dir, "Dockerfile")
        except TaskError as exc:
            raise UnsupportedEnvironment(str(exc)) from None

    def environment_key(self) -> str:
        """Content hash of what defines the sandbox's starting state (for image caches, pools)."""
        digest = hashlib.sha256()
        digest.update(repr((self.docker_image, self.workdir, sorted(self.env.items()),
                            self.network, self.memory_mb, self.cpus, self.pids_limit,
                            self.storage_mb, sorted(self.read_only_mounts.items()))).encode())
        if self.environment_dir is not None:
            digest.update(_tree_digest(self.environment_dir))
        return digest.hexdigest()

    @classmethod
    def from_task(cls, task: TaskSpec, config: SandboxConfig) -> SandboxSpec:
        env_cfg = task.config.environment
        workdir = env_cfg.workdir
        if workdir is None and task.dockerfile.is_file():
            workdir = final_workdir(parse_dockerfile(
                read_task_text(task.task_dir, "environment/Dockerfile")))
        deadline = config.deadline_s or (
            task.agent_timeout_s + task.verifier_timeout_s + DEADLINE_MARGIN_S)
        return cls(
            name=task.name,
            environment_dir=task.environment_dir if task.environment_dir.is_dir() else None,
            docker_image=env_cfg.docker_image,
            workdir=workdir or "/",
            env=dict(env_cfg.env),
            network=task.network_allowed,
            memory_mb=config.memory_mb or env_cfg.memory_mb or DEFAULT_MEMORY_MB,
            cpus=float(config.cpus or env_cfg.cpus or 1),
            pids_limit=config.pids_limit,
            storage_mb=config.storage_mb or env_cfg.storage_mb or DEFAULT_STORAGE_MB,
            deadline_s=deadline,
            max_output_bytes=config.max_output_bytes,
        )


_TREE_DIGESTS: dict[Path, tuple[tuple[tuple[str, int, int, int], ...], bytes]] = {}
"""Directory -> (its files' signature, their digest): an unchanged tree is not read again."""


def _tree_digest(directory: Path) -> bytes:
    """sha256 over a tree's files (each one's relative path, then its bytes; links to files
    followed, links to folders not), in path order. Reused while every file keeps its inode,
    size and change time: a ctime cannot be set back, so any write shows."""
    files = []
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            try:
                stat = os.stat(path)
            except OSError:
                continue  # a dangling link: not a file
            if S_ISREG(stat.st_mode):
                files.append((os.path.relpath(path, directory), stat.st_ino, stat.st_size,
                              stat.st_ctime_ns))
    files.sort(key=lambda file: file[0].split(os.sep))
    signature = tuple(files)
    cached = _TREE_DIGESTS.get(directory)
    if cached is not None and cached[0] == signature:
        return cached[1]
    digest = hashlib.sha256()
    for relative, *_ in files:
        digest.update(relative.encode())
        digest.update((directory / relative).read_bytes())
    value = digest.digest()
    _TREE_DIGESTS[directory] = (signature, value)
    return value


class Sandbox(ABC):
    """An isolated place to run commands; use as `async with backend(spec, config) as sandbox:`."""

    def __init__(self, spec: SandboxSpec, config: SandboxConfig | None = None) -> None:
        self.spec = spec
        self.config = config or SandboxConfig()
        self._started_at: float | None = None

    @classmethod
    def preflight(cls, specs: Sequence[SandboxSpec], config: SandboxConfig) -> None:
        """Before any work: raise UnsupportedEnvironment (one line for the user) when this
        backend cannot start sandboxes of these specs at all. Default: nothing to check."""
        return None  # a backend that can always start what it is given

    @abstractmethod
    async def start(self) -> None:
        """Create the sandbox from its spec; raise SandboxError or UnsupportedEnvironment."""

    @abstractmethod
    async def exec(self, command: str, timeout: float | None = None, cwd: str | None = None,
                   env: Mapping[str, str] | None = None, user: str | int | None = None,
                   ) -> ExecResult:
        """Run `command` with bash; kill its whole process group at `timeout` seconds."""

    @abstractmethod
    async def extract(self, archive: bytes, remote_dir: str) -> None:
        """Unpack a tar (made on the host) into the sandbox folder `remote_dir`, with the
        sandbox's own tar, so links in it resolve inside the sandbox."""

    async def extract_replacing(self, archive: bytes, remote_dir: str,
                                replaced: Sequence[str]) -> None:
        """extract(), once the sandbox paths `replaced` are deleted (as root). A backend that
        can do both in one command overrides this: it is on the verifier's hand-over."""
        for path in replaced:
            removed = await self.exec(f"rm -rf -- {shlex.quote(path)}", timeout=120, cwd="/",
                                      user=0)
            if not removed.ok:
                raise SandboxError(f"cannot clear {path}: {removed.stderr.strip()[-200:]}")
        await self.extract(archive, remote_dir)

    async def upload(self, local: Path, remote: str) -> None:
        """Copy a host file or folder to the absolute sandbox path `remote`."""
        parent = os.path.dirname(remote.rstrip("/")) or "/"
        await self.extract(await asyncio.to_thread(pack, local, remote), parent)

    async def upload_task_folder(self, task_dir: Path, rel: str, remote: str) -> None:
        """Copy the task folder `rel` to the absolute sandbox path `remote`, read as every
        task file is (tasks/files.py: no link, no hard link, nothing out of the task)."""
        remote = remote.rstrip("/")
        archive = await asyncio.to_thread(pack_task_folder, task_dir, rel,
                                          os.path.basename(remote))
        await self.extract(archive, os.path.dirname(remote) or "/")

    @abstractmethod
    async def read_file(self, remote: str, limit: int = FILE_READ_LIMIT) -> bytes | None:
        """The bytes of a regular file in the sandbox, None when it is missing or anything else
        (a link is not followed); ArtifactLimitExceeded past `limit`."""

    @abstractmethod
    async def collect(self, remote: str, writer: BundleWriter) -> bool:
        """Add the sandbox path `remote` (file or folder, links kept as links) to a bundle;
        False when it does not exist. Raises ArtifactLimitExceeded past the writer's limits."""

    def network_namespace(self) -> str:
        """The started sandbox's network namespace (a /proc path), where the host may open a
        listening socket of its own (sandboxes/loopback_route.py)."""
        raise UnsupportedEnvironment(f"{type(self).__name__} gives no network namespace")

    def end(self, reason: str) -> None:
        """End the sandbox now for what ran in it (`reason`: e.g. a limit of a host service it
        passed): its processes are killed and every later call raises SandboxDied saying so
        (reward 0, kept: the sample's own failure). stop() still deletes it."""
        raise UnsupportedEnvironment(f"{type(self).__name__} cannot be ended early")

    @abstractmethod
    async def kill_processes(self) -> None:
        """Kill every process that commands started (the agent's, before verification); the
        sandbox's files stay and it still runs new commands."""

    @abstractmethod
    async def stop(self) -> None:
        """Kill everything the sandbox started and delete it. Safe to call twice."""

    def remaining_s(self) -> float:
        """Seconds left before the deadline."""
        if self._started_at is None:
            return self.spec.deadline_s
        return max(0.0, self.spec.deadline_s - (time.monotonic() - self._started_at))

    def _effective_timeout(self, timeout: float | None) -> float:
        remaining = self.remaining_s()
        if remaining <= 0:
            raise SandboxError(f"sandbox {self.spec.name} passed its deadline")
        return min(timeout, remaining) if timeout is not None else remaining

    @classmethod  # noqa: B027 - a hook, empty by default
    def check_backend_name(cls, name: str) -> None:
        """Reject a backend name this class cannot work with (e.g. a KIND:ARG without ARG),
        with one line, before any sandbox starts. Plain names need no check."""

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            await asyncio.shield(self.stop())
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await asyncio.shield(self.stop())


def sandbox_backend(name: str) -> type[Sandbox]:
    """The Sandbox class registered as `name`; for `KIND:ARG` (e.g. harbor:docker), the one
    registered as KIND, which reads ARG from its config."""
    backend: type[Sandbox] = plugins.load(plugins.SANDBOXES, name.partition(":")[0])
    backend.check_backend_name(name)
    return backend


def preflight(tasks: Sequence[TaskSpec], config: SandboxConfig) -> None:
    """The configured backend's check that it can run these tasks (before a run starts)."""
    specs = [SandboxSpec.from_task(task, config) for task in tasks]
    sandbox_backend(config.backend).preflight(specs, config)


def create_sandbox(spec: SandboxSpec, config: SandboxConfig) -> Sandbox:
    """An unstarted sandbox of the configured backend."""
    return sandbox_backend(config.backend)(spec, config)
