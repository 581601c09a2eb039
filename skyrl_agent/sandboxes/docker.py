"""The `docker` backend: one container per sandbox, built from the task's environment/Dockerfile.

Images are cached by a content hash of environment/ (rebuilt only when it changes). Public base
images the engine does not have are mapped to local tags (`sandbox.docker.base_images`), so tasks
that say `FROM ubuntu:24.04` build on machines that cannot pull. Containers get no network unless
the task allows it, memory/cpu/pids limits, and a main process that exits at the deadline; with
auto-remove, a container disappears at its deadline even if this process died.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import shutil
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from skyrl_agent.sandboxes.archive import pack, unpack
from skyrl_agent.sandboxes.base import ExecResult, Sandbox, SandboxError, UnsupportedEnvironment

IMAGE_REPO = "skyrl-agent-task"
LABEL = "skyrl-agent.sandbox"
_build_locks: dict[str, asyncio.Lock] = {}


def docker_client():
    """A client for the local engine; a clear error when none is running."""
    import docker
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except docker.errors.DockerException as exc:
        raise UnsupportedEnvironment(
            f"no Docker engine answers ({exc.__class__.__name__}); start dockerd "
            "(scripts/docker-engine.sh start) or use --sandbox local") from None
    return client


def _cut(data: bytes | None, limit: int) -> str:
    data = data or b""
    if len(data) > limit:
        half = limit // 2
        data = data[:half] + f"\n[... {len(data) - 2 * half} bytes cut ...]\n".encode() + data[-half:]
    return data.decode(errors="replace")


class DockerSandbox(Sandbox):
    """A container on the local Docker engine."""

    def __init__(self, spec, config=None) -> None:
        super().__init__(spec, config)
        self.name = f"skyrl-{re.sub(r'[^a-zA-Z0-9_.-]', '-', spec.name)[:40]}-{uuid.uuid4().hex[:8]}"
        self._client = None
        self.container = None

    async def start(self) -> None:
        self._client = await asyncio.to_thread(docker_client)
        image = await self._image()
        self._started_at = time.monotonic()
        # If we are cancelled mid-create, wait for the container anyway so stop() can remove it.
        creating = asyncio.ensure_future(asyncio.to_thread(self._run_container, image))
        try:
            self.container = await asyncio.shield(creating)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                self.container = await creating
            raise

    def _run_container(self, image: str):
        spec = self.spec
        return self._client.containers.run(
            image, command=["sleep", str(int(spec.deadline_s) + 1)], name=self.name,
            detach=True, auto_remove=True, init=True, working_dir=spec.workdir,
            environment=dict(spec.env), network_mode=None if spec.network else "none",
            mem_limit=f"{spec.memory_mb}m", memswap_limit=f"{spec.memory_mb}m",
            nano_cpus=int(spec.cpus * 1e9), pids_limit=spec.pids_limit,
            cap_drop=["ALL"],
            cap_add=["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "SETUID", "SETGID", "KILL"],
            security_opt=["no-new-privileges"], runtime=self.config.docker.runtime,
            labels={LABEL: spec.name, f"{LABEL}.deadline": str(time.time() + spec.deadline_s)},
        )

    # ---- images -------------------------------------------------------------------------------
    async def _image(self) -> str:
        if self.spec.dockerfile is None:
            if not self.spec.docker_image:
                raise UnsupportedEnvironment(f"task {self.spec.name} has no Dockerfile or image")
            return await asyncio.to_thread(self._mapped_base, self.spec.docker_image)
        tag = f"{IMAGE_REPO}:{self.spec.environment_key()[:16]}"
        lock = _build_locks.setdefault(tag, asyncio.Lock())
        async with lock:
            if not await asyncio.to_thread(self._has_image, tag):
                await asyncio.to_thread(self._build, tag)
        return tag

    def _has_image(self, name: str) -> bool:
        import docker
        try:
            self._client.images.get(name)
            return True
        except docker.errors.ImageNotFound:
            return False

    def _mapped_base(self, image: str) -> str:
        """The image itself when the engine has it, else its configured local stand-in."""
        if self._has_image(image):
            return image
        return self.config.docker.base_images.get(image, image)

    def _build(self, tag: str) -> None:
        import docker
        lines = []
        for line in self.spec.dockerfile.read_text().splitlines():
            words = line.split()
            if words and words[0].upper() == "FROM":
                image_at = next(i for i, w in enumerate(words[1:], 1) if not w.startswith("--"))
                words[image_at] = self._mapped_base(words[image_at])
                line = " ".join(words)
            lines.append(line)
        with tempfile.TemporaryDirectory() as context:
            shutil.copytree(self.spec.environment_dir, context, dirs_exist_ok=True)
            Path(context, "Dockerfile").write_text("\n".join(lines) + "\n")
            try:
                self._client.images.build(path=context, tag=tag, rm=True, forcerm=True,
                                          timeout=self.config.docker.build_timeout_s)
            except docker.errors.BuildError as exc:
                log = "".join(str(c.get("stream", "")) for c in exc.build_log)[-800:]
                raise SandboxError(
                    f"image build for {self.spec.name} failed: {exc.msg}\n{log}") from None

    # ---- commands and files -------------------------------------------------------------------
    async def exec(self, command: str, timeout: float | None = None, cwd: str | None = None,
                   env: Mapping[str, str] | None = None, user: str | int | None = None,
                   ) -> ExecResult:
        if self.container is None:
            raise SandboxError(f"sandbox {self.spec.name} is not running")
        limit = self._effective_timeout(timeout)
        # `timeout` puts the command in its own process group and kills the group at the limit.
        wrapped = ["timeout", "-s", "KILL", f"{limit:.3f}", "bash", "-c", command]
        started = time.monotonic()
        try:
            code, (out, err) = await asyncio.wait_for(asyncio.to_thread(
                self._exec_blocking, wrapped, cwd, env, user), timeout=limit + 30)
        except TimeoutError:
            raise SandboxError(f"sandbox {self.spec.name} stopped answering") from None
        duration = time.monotonic() - started
        timed_out = code == 137 and duration >= limit - 0.05
        max_out = self.spec.max_output_bytes
        return ExecResult(-1 if timed_out else code, _cut(out, max_out), _cut(err, max_out),
                          timed_out, duration)

    def _exec_blocking(self, argv, cwd, env, user):
        import docker
        try:
            result = self.container.exec_run(
                argv, workdir=cwd or self.spec.workdir, environment=dict(env or {}),
                user="" if user is None else str(user), demux=True)
        except docker.errors.APIError as exc:
            raise SandboxError(f"sandbox {self.spec.name} died: {exc.explanation}") from None
        return result.exit_code, result.output

    async def upload(self, local: Path, remote: str) -> None:
        parent = os.path.dirname(remote.rstrip("/")) or "/"
        made = await self.exec(f"mkdir -p {shlex.quote(parent)}", timeout=60)
        if not made.ok:
            raise SandboxError(f"upload to {remote} failed: {made.stderr.strip()}")
        await asyncio.to_thread(self.container.put_archive, parent, pack(local, remote))

    async def download(self, remote: str, local: Path) -> None:
        import docker
        try:
            stream, _ = await asyncio.to_thread(self.container.get_archive, remote)
            data = await asyncio.to_thread(lambda: b"".join(stream))
        except docker.errors.NotFound:
            raise FileNotFoundError(f"{remote} in sandbox {self.spec.name}") from None
        # The engine names the archive's top entry after the path's base name.
        unpack(data, os.path.basename(remote.rstrip("/")), local)

    async def stop(self) -> None:
        if self.container is None:
            return
        container, self.container = self.container, None
        await asyncio.to_thread(self._remove, container)

    @staticmethod
    def _remove(container) -> None:
        import docker
        try:
            container.remove(force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if "already in progress" not in str(exc):
                raise


def reap_expired_containers() -> int:
    """Remove sandbox containers whose deadline has passed (left by a process that was killed)."""
    client = docker_client()
    removed = 0
    for container in client.containers.list(all=True, filters={"label": LABEL}):
        deadline = float(container.labels.get(f"{LABEL}.deadline", "inf"))
        if deadline < time.time():
            DockerSandbox._remove(container)
            removed += 1
    return removed
