"""The `harbor:<type>` backend: our Sandbox protocol over any Harbor environment.

`--sandbox harbor:docker`, `harbor:daytona`, `harbor:modal`, ... (a Harbor EnvironmentType) or
`harbor:package.module:Class` (an import path, as `harbor run -e` takes) runs our agents and
verifier in an environment Harbor creates from the task directory. The same adapter wraps the
environment a Harbor trial hands to one of our agents (skyrl_agent.harbor).

Isolation is the Harbor provider's. Files leave the environment through Harbor's own transfer
into a private host folder and are read from there without following links (artifacts.py), so
a link planted in the sandbox cannot make the host read its own files. Harbor's transfer and
exec are not size-bounded on the host the way the local and docker backends are: output is cut
here after it arrives, files once they are on the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import shlex
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from skyrl_agent.config import SandboxConfig
from skyrl_agent.sandboxes.artifacts import (
    BundleWriter,
    collect_tree,
    read_tree_file,
    run_collection,
    sandbox_relative,
)
from skyrl_agent.sandboxes.base import (
    FILE_READ_LIMIT,
    ExecResult,
    Sandbox,
    SandboxError,
    SandboxSpec,
    UnsupportedEnvironment,
)
from skyrl_agent.sandboxes.docker import KILL_ALL
from skyrl_agent.sandboxes.exec_server import HeadTail
from skyrl_agent.sandboxes.harbor_docker import (
    compose1_environment,
    compose_frontend,
    prebuilt_image,
)

PREFIX = "harbor:"

# A process is named by its pid and start time (field 22 of /proc/PID/stat, read after the last
# ") " since a process names its own comm), so a later process cannot pass for an old one.
_PROCESS_ID = ('read -r stat < /proc/$p/stat 2>/dev/null || continue; rest=${stat##*) }; '
               'set -- $rest; id="$p:${20}"')
# The environment's own processes (main process, keeper) are those alive at start.
LIST_PROCESSES = ('for p in /proc/[0-9]*; do p=${p#/proc/}; '
                  '[ "$p" = $$ ] || [ "$p" = $PPID ] && continue; ' + _PROCESS_ID + '; '
                  'printf "%s " "$id"; done')
# Then SIGKILL every other process, round after round, until none is left but zombies and the
# `sleep` children of kept processes (a keeper loop restarts those; they are killed too).
KILL_LATER = ('keep=" $KEEP "; for ((round = 0; round < 200; round++)); do left=0; '
              'for p in /proc/[0-9]*; do p=${p#/proc/}; '
              '[ "$p" = $$ ] || [ "$p" = $PPID ] && continue; ' + _PROCESS_ID + '; '
              '[ "${keep#* $id }" != "$keep" ] && continue; kill -9 "$p" 2>/dev/null; '
              '[ "$1" = Z ] && continue; '
              '[ "${stat#* (sleep) }" != "$stat" ] && [ "${keep#* $2:}" != "$keep" ] && continue; '
              'left=$((left + 1)); done; '
              '[ "$left" = 0 ] && exit 0; sleep 0.01; done; echo "$left left"; exit 1')


def check_options(backend: str, options: Mapping[str, Any]) -> None:
    """Harbor's own check of an environment's options (its options model, then credentials
    and daemons), as `harbor run` makes it before queueing trials; one line when it fails."""
    from harbor.environments.factory import EnvironmentFactory
    from harbor.models.environment_type import EnvironmentType

    kind = harbor_kind(backend)
    try:
        if ":" in kind:
            EnvironmentFactory.run_preflight(None, import_path=kind, kwargs=dict(options))
        else:
            EnvironmentFactory.run_preflight(EnvironmentType(kind), kwargs=dict(options))
    except (ValueError, ImportError) as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        raise UnsupportedEnvironment(f"harbor environment {kind!r}: {_sentences(lines)}") from None
    except SystemExit as exc:  # what Harbor's preflight raises for missing credentials
        raise UnsupportedEnvironment(f"harbor environment {kind!r}: {exc.code}") from None


def _sentences(lines: list[str]) -> str:
    return " ".join(line if line[-1] in ".:!?" else f"{line}." for line in lines)


def harbor_kind(backend: str) -> str:
    """The Harbor environment a `harbor:<kind>` backend names (type or import path)."""
    kind = backend.removeprefix(PREFIX)
    if not backend.startswith(PREFIX) or not kind:
        raise UnsupportedEnvironment(
            f"sandbox backend {backend!r}: say harbor:TYPE (docker, daytona, modal, e2b, ...) "
            "or harbor:package.module:Class")
    return kind


def _cut(text: str | None, limit: int) -> str:
    buffer = HeadTail(limit)
    buffer.add((text or "").encode())
    return buffer.value().decode(errors="replace")


class HarborSandbox(Sandbox):
    """A Harbor BaseEnvironment behind the Sandbox protocol. Built from a spec, it creates and
    owns its environment; `wrapping` adopts one a Harbor trial owns (never started or stopped
    here)."""

    def __init__(self, spec: SandboxSpec, config: SandboxConfig | None = None) -> None:
        super().__init__(spec, config)
        self.environment: Any = None
        self._owned = True
        self._own_processes: str | None = None
        """The environment's processes at start (`pid:starttime ...`), spared by kill_processes."""
        self._scratch: tempfile.TemporaryDirectory[str] | None = None

    @classmethod
    def check_backend_name(cls, name: str) -> None:
        harbor_kind(name)

    @classmethod
    def preflight(cls, specs: Sequence[SandboxSpec], config: SandboxConfig) -> None:
        check_options(config.backend, config.harbor_options)

    @classmethod
    def wrapping(cls, environment: Any, spec: SandboxSpec) -> HarborSandbox:
        sandbox = cls(spec)
        sandbox.environment, sandbox._owned = environment, False
        sandbox._started_at = time.monotonic()
        return sandbox

    # ---- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        if self.spec.environment_dir is None:
            raise UnsupportedEnvironment("harbor environments are built from a task's "
                                         "environment/ folder; this task has none")
        self._scratch = tempfile.TemporaryDirectory(prefix="skyrl-harbor-")
        image = None
        if harbor_kind(self.config.backend) == "docker":
            image = await prebuilt_image(self.spec, self.config)
        self.environment = await asyncio.to_thread(self._create, Path(self._scratch.name), image)
        try:
            await self.environment.start(force_build=False)
        except Exception as exc:  # any provider failure is infrastructure
            raise SandboxError(f"harbor environment {harbor_kind(self.config.backend)} did "
                               f"not start: {type(exc).__name__}: {exc}") from exc
        self._started_at = time.monotonic()
        listed = await self.exec(LIST_PROCESSES, timeout=60, cwd="/", user=0)
        if not listed.ok:
            raise SandboxError(f"sandbox {self.spec.name}: its processes could not be listed")
        self._own_processes = listed.stdout.strip()

    def _create(self, scratch: Path, image: str | None) -> Any:
        """Harbor's environment for the task; `image` (built here) replaces Harbor's build."""
        from harbor.environments.factory import EnvironmentFactory
        from harbor.models.task.task import Task
        from harbor.models.trial.config import EnvironmentConfig
        from harbor.models.trial.paths import TrialPaths

        assert self.spec.environment_dir is not None
        kind = harbor_kind(self.config.backend)
        where = {"import_path": kind} if ":" in kind else {"type": kind}
        trial_paths = TrialPaths(scratch / "trial")
        trial_paths.mkdir()
        task_env = Task(self.spec.environment_dir.parent).config.environment
        if image is not None:
            task_env = task_env.model_copy(update={"docker_image": image})
        options: dict[str, Any] = dict(
            environment_dir=self.spec.environment_dir,
            environment_name=self.spec.name.replace("/", "-"),
            session_id=f"skyrl-{uuid.uuid4().hex[:12]}", trial_paths=trial_paths,
            task_env_config=task_env, **self.config.harbor_options)
        try:
            if kind == "docker" and compose_frontend() == "v1":
                return compose1_environment()(**options)
            return EnvironmentFactory.create_environment_from_config(
                EnvironmentConfig(**where), **options)
        except (ValueError, ImportError) as exc:
            raise UnsupportedEnvironment(f"harbor environment {kind!r}: {exc}") from None

    async def stop(self) -> None:
        environment, self.environment = self.environment, None
        if environment is not None and self._owned:
            with contextlib.suppress(Exception):  # stopping is best effort, like any backend
                await environment.stop(delete=True)
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None

    def _running(self) -> Any:
        if self.environment is None:
            raise SandboxError(f"sandbox {self.spec.name} is not running")
        return self.environment

    # ---- commands ---------------------------------------------------------------------------
    async def exec(self, command: str, timeout: float | None = None, cwd: str | None = None,
                   env: Mapping[str, str] | None = None, user: str | int | None = None,
                   ) -> ExecResult:
        environment = self._running()
        limit = self._effective_timeout(timeout)
        wrapped = f"timeout -s KILL {limit:.3f} bash -c {shlex.quote(command)}"
        started = time.monotonic()
        try:
            result = await asyncio.wait_for(environment.exec(
                wrapped, cwd=cwd, env=dict(env) if env else None,
                timeout_sec=math.ceil(limit) + 5, user=user), timeout=limit + 30)
        except TimeoutError:
            raise SandboxError(f"sandbox {self.spec.name} stopped answering") from None
        except Exception as exc:  # the provider's own failure
            raise SandboxError(f"harbor exec failed in {self.spec.name}: "
                               f"{type(exc).__name__}: {exc}") from exc
        duration = time.monotonic() - started
        timed_out = result.return_code == 137 and duration >= limit - 0.05
        size = self.spec.max_output_bytes
        return ExecResult(-1 if timed_out else result.return_code, _cut(result.stdout, size),
                          _cut(result.stderr, size), timed_out, duration)

    async def kill_processes(self) -> None:
        # An adopted environment (a Harbor trial's, over our sandbox) has the docker keeper.
        # Run straight, not under exec()'s `timeout`: kill -1 would end that wrapper too.
        if self._own_processes is None:
            script = KILL_ALL
        else:
            script = f"KEEP={shlex.quote(self._own_processes)}; {KILL_LATER}"
        result = await self._running().exec(f"bash -c {shlex.quote(script)}", timeout_sec=60,
                                            user=0)
        if result.return_code != 0:
            raise SandboxError(f"sandbox {self.spec.name}: processes could not be killed "
                               f"({(result.stdout or '').strip()[-200:]})")

    # ---- files ------------------------------------------------------------------------------
    async def extract(self, archive: bytes, remote_dir: str) -> None:
        name = f"/tmp/.skyrl-upload-{uuid.uuid4().hex}.tar"
        with tempfile.TemporaryDirectory(prefix="skyrl-harbor-up-") as scratch:
            local = Path(scratch) / "upload.tar"
            local.write_bytes(archive)
            await self._running().upload_file(local, name)
        unpack = (f"mkdir -p {shlex.quote(remote_dir)} && tar -xf {name} -C "
                  f"{shlex.quote(remote_dir)}; status=$?; rm -f {name}; exit $status")
        result = await self.exec(unpack, timeout=120, cwd="/", user=0)
        if not result.ok:
            raise SandboxError(f"unpacking into {remote_dir} failed: "
                               f"{(result.stderr or result.stdout).strip()[-300:]}")

    async def _download(self, remote: str) -> tuple[tempfile.TemporaryDirectory[str], bool]:
        """`remote` copied by Harbor into a private host folder that mirrors the sandbox's
        `/`; and whether it existed."""
        environment = self._running()
        folder = tempfile.TemporaryDirectory(prefix="skyrl-harbor-down-")
        target = Path(folder.name) / sandbox_relative(remote)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            if await environment.is_dir(remote, user=0):
                await environment.download_dir(remote, target)
            elif await environment.is_file(remote, user=0):
                await environment.download_file(remote, target)
            else:
                return folder, False
        except Exception as exc:  # the provider's transfer failed
            folder.cleanup()
            raise SandboxError(f"reading {remote} from {self.spec.name} failed: "
                               f"{type(exc).__name__}: {exc}") from exc
        return folder, True

    async def read_file(self, remote: str, limit: int = FILE_READ_LIMIT) -> bytes | None:
        folder, found = await self._download(remote)
        with folder:
            return read_tree_file(Path(folder.name), remote, limit) if found else None

    async def collect(self, remote: str, writer: BundleWriter) -> bool:
        folder, found = await self._download(remote)
        with folder:
            return found and await run_collection(
                writer, lambda: collect_tree(Path(folder.name), remote, writer))
