"""The `docker` backend: one container per sandbox, built from the task's environment/Dockerfile.

Images are cached by a content hash of environment/ (rebuilt only when it changes). Public base
images the engine does not have are mapped to local tags (`sandbox.docker.base_images`), so tasks
that say `FROM ubuntu:24.04` build on machines that cannot pull. Containers get no network unless
the task allows it, memory/cpu/pids limits, and a main process that exits at the deadline; with
auto-remove, a container disappears at its deadline even if this process died.

The main process is a small bash loop (PID 1, ignoring every signal it can) that reaps orphans,
so `kill_processes` can SIGKILL everything else and the container lives on for verification:
with the container's cgroup frozen, the host SIGKILLs every process in it but the keeper, so a
fork bomb cannot race the kill (see cgroups.end_processes).
Disk: the engine here cannot cap a container's writable layer (overlay2 on ext4), so a file-size
rlimit bounds each file and a watchdog polls the layer's size and kills the container past
`storage_mb`. Command output is streamed and cut on the host (head and tail), and files come out
only through the engine's archive, read member by member by artifacts.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shlex
import tarfile
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from skyrl_agent.config import SandboxConfig
from skyrl_agent.descriptors import (
    clean_up,
    open_descriptors,
    open_file_limit,
    out_of_descriptors,
    prepare,
)
from skyrl_agent.errors import TaskError
from skyrl_agent.sandboxes.artifacts import BundleWriter, run_collection
from skyrl_agent.sandboxes.base import (
    FILE_READ_LIMIT,
    ExecResult,
    Sandbox,
    SandboxDied,
    SandboxError,
    SandboxSpec,
    UnsupportedEnvironment,
)
from skyrl_agent.sandboxes.cgroups import cgroup_of, end_processes
from skyrl_agent.sandboxes.engine_archive import collect_tar_stream, read_tar_file
from skyrl_agent.sandboxes.exec_server import HeadTail
from skyrl_agent.tasks.files import copy_task_folder

if TYPE_CHECKING:  # docker is imported lazily: only this backend needs it
    from docker import DockerClient
    from docker.models.containers import Container

IMAGE_REPO = "skyrl-agent-task"
LABEL = "skyrl-agent.sandbox"
_build_locks: dict[tuple[int, str], asyncio.Lock] = {}  # per event loop and tag
STORAGE_POLL_S = 1.0
T = TypeVar("T")
# PID 1: ignores what it can, reaps orphans (bash waits on any child), ends at the deadline. It
# forks its `sleep` once and waits for it, forking again only when that sleep is killed (by a
# kill of the sandbox's processes, which frees the pids limit): a keeper that forked a `sleep`
# every second died when a fork bomb held the limit past bash's fork retries (about 15 s), and
# took the container, and the honest agent's reward, with it.
KEEPER = ('trap "" HUP INT QUIT TERM USR1 USR2 PIPE; end=$((SECONDS + {seconds})); '
          'while [ "$SECONDS" -lt "$end" ]; do sleep $((end - SECONDS)) & wait $!; done')
# Where the host cannot see the container's cgroup (a remote or rootless engine), run as root in
# the container: SIGKILL all but PID 1 and ourselves until nothing else is left but
# the keeper's own `sleep` (one kill -1 round is atomic against fork, so no agent process can be
# that sleep; the stat line is read after its last ") " since a process names its own comm).
# The scan uses builtins only: a sandbox at its pids limit has no room for a fork. Zombies count
# as left until the keeper reaps them, since they still hold places under the pids limit.
KILL_ALL = ('for ((round = 0; round < 200; round++)); do kill -9 -1 2>/dev/null; left=0; '
            'for p in /proc/[0-9]*; do p=${p#/proc/}; '
            '[ "$p" = 1 ] || [ "$p" = $$ ] && continue; '
            'read -r stat < /proc/$p/stat 2>/dev/null || continue; rest=${stat##*) }; '
            'set -- $rest; [ "$1" != Z ] && [ "$2" = 1 ] && '
            '[ "${stat#* (sleep) }" != "$stat" ] && continue; '
            'left=$((left + 1)); done; '
            '[ "$left" = 0 ] && exit 0; sleep 0.01; done; echo "$left left"; exit 1')


def _task_tag(spec: SandboxSpec) -> str:
    """The image built from a spec's Dockerfile, named by the content of its environment."""
    return f"{IMAGE_REPO}:{spec.environment_key()[:16]}"


def docker_client() -> DockerClient:
    """A client for the local engine; a clear error when none is running."""
    import docker
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except docker.errors.DockerException as exc:
        if out_of_descriptors(exc):  # the engine may be fine: this process cannot reach it
            raise SandboxError(
                f"this process is out of file descriptors ({open_descriptors()} open of "
                f"{open_file_limit()}): the Docker engine cannot be reached") from None
        raise UnsupportedEnvironment(
            f"no Docker engine answers ({exc.__class__.__name__}); start dockerd "
            "(scripts/docker-engine.sh start) or use --sandbox local") from None
    return client


class DockerSandbox(Sandbox):
    """A container on the local Docker engine."""

    def __init__(self, spec, config=None) -> None:
        super().__init__(spec, config)
        label = re.sub(r"[^a-zA-Z0-9_.-]", "-", spec.name)[:40]
        self.name = f"skyrl-{label}-{uuid.uuid4().hex[:8]}"
        self._client: DockerClient | None = None
        self.container: Container | None = None
        self._watchdog: asyncio.Task | None = None
        self._dead_reason: str | None = None

    @classmethod
    def preflight(cls, specs: Sequence[SandboxSpec], config: SandboxConfig) -> None:
        """The engine answers and has (or can pull) every image the tasks build on."""
        from skyrl_agent.sandboxes.docker_images import check_images
        check_images(docker_client(), specs, config, _task_tag)

    @property
    def client(self) -> DockerClient:
        if self._client is None:
            raise SandboxError(f"sandbox {self.spec.name} is not started")
        return self._client

    @property
    def running(self) -> Container:
        """The container, or SandboxError once it is stopped (or before it exists)."""
        if self.container is None:
            raise SandboxError(f"sandbox {self.spec.name} is not running")
        return self.container

    async def start(self) -> None:
        prepare()  # the host's open-file limit raised, its reserve held (descriptors.py)
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
        self._watchdog = asyncio.create_task(self._watch_storage())

    def _run_container(self, image: str) -> Container:
        spec = self.spec
        import docker
        storage = spec.storage_mb * 1024 * 1024
        return self.client.containers.run(
            image, command=["bash", "-c", KEEPER.format(seconds=int(spec.deadline_s) + 1)],
            name=self.name, detach=True, auto_remove=True, init=False, working_dir=spec.workdir,
            ulimits=[docker.types.Ulimit(name="fsize", soft=storage, hard=storage)],
            # Public tasks: docker's default bridge. Its gateway reaches host services bound on
            # 0.0.0.0, never those on 127.0.0.1 (the model server, Tinker and Ray bind there).
            environment=dict(spec.env), network_mode=None if spec.network else "none",
            mem_limit=f"{spec.memory_mb}m", memswap_limit=f"{spec.memory_mb}m",
            nano_cpus=int(spec.cpus * 1e9), pids_limit=spec.pids_limit,
            cap_drop=["ALL"],
            cap_add=["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "SETUID", "SETGID", "KILL"],
            security_opt=["no-new-privileges"], runtime=self.config.docker.runtime,
            mounts=[docker.types.Mount(inside, host, type="bind", read_only=True)
                    for inside, host in spec.read_only_mounts.items()],
            labels={LABEL: spec.name, f"{LABEL}.deadline": str(time.time() + spec.deadline_s)},
        )

    # ---- images -------------------------------------------------------------------------------
    async def built_image(self) -> str:
        """The image this sandbox's container would run, built when the engine lacks it."""
        if self._client is None:
            self._client = await asyncio.to_thread(docker_client)
        return await self._image()

    async def _image(self) -> str:
        dockerfile = self.spec.dockerfile
        if dockerfile is None:
            if not self.spec.docker_image:
                raise UnsupportedEnvironment(f"task {self.spec.name} has no Dockerfile or image")
            return await asyncio.to_thread(self._mapped_base, self.spec.docker_image)
        tag = _task_tag(self.spec)
        lock = _build_locks.setdefault((id(asyncio.get_running_loop()), tag), asyncio.Lock())
        async with lock:
            if not await asyncio.to_thread(self._has_image, tag):
                await asyncio.to_thread(self._build, tag, dockerfile)
        return tag

    def _has_image(self, name: str) -> bool:
        import docker
        try:
            self.client.images.get(name)
            return True
        except docker.errors.ImageNotFound:
            return False

    def _mapped_base(self, image: str) -> str:
        """The image itself when the engine has it, else its configured local stand-in."""
        if self._has_image(image):
            return image
        return self.config.docker.base_images.get(image, image)

    def _build(self, tag: str, dockerfile: Path) -> None:
        """Build `dockerfile` with its folder (the task's environment/) as the context."""
        import docker
        lines = []
        for line in self.spec.dockerfile_text().splitlines():
            words = line.split()
            if words and words[0].upper() == "FROM":
                image_at = next(i for i, w in enumerate(words[1:], 1) if not w.startswith("--"))
                words[image_at] = self._mapped_base(words[image_at])
                line = " ".join(words)
            lines.append(line)
        with tempfile.TemporaryDirectory() as context:
            # File by file as tasks/files.py reads them: a link in environment/ is never
            # followed into the image (copytree copied what a symlink pointed at).
            try:
                copy_task_folder(dockerfile.parent.parent, dockerfile.parent.name, Path(context))
            except TaskError as exc:
                raise UnsupportedEnvironment(str(exc)) from None
            Path(context, "Dockerfile").write_text("\n".join(lines) + "\n")
            try:
                self.client.images.build(path=context, tag=tag, rm=True, forcerm=True,
                                          timeout=self.config.docker.build_timeout_s)
            except docker.errors.BuildError as exc:
                log = "".join(str(c.get("stream", "")) for c in exc.build_log)[-800:]
                raise SandboxError(
                    f"image build for {self.spec.name} failed: {exc.msg}\n{log}") from None

    async def _watch_storage(self) -> None:
        """Kill the container once its writable layer passes storage_mb."""
        limit = self.spec.storage_mb * 1024 * 1024
        while self.container is not None:
            await asyncio.sleep(STORAGE_POLL_S)
            try:
                found = await asyncio.to_thread(
                    self.client.api.containers, all=True, size=True,
                    filters={"id": self.running.id})
            except Exception:  # noqa: BLE001 - engine busy or gone: exec reports it
                continue
            if not found:
                return
            if (found[0].get("SizeRw") or 0) > limit:
                self._dead_reason = f"it wrote over its {self.spec.storage_mb} MB of disk"
                await asyncio.to_thread(self._kill_container)
                return

    def _kill_container(self) -> None:
        with contextlib.suppress(Exception):
            self.running.kill()

    def end(self, reason: str) -> None:
        if self._dead_reason is None:
            self._dead_reason = reason  # every call from now on raises SandboxDied
        if self.container is not None:  # the engine call off the event loop
            asyncio.get_running_loop().run_in_executor(None, self._kill_container)

    # ---- commands and files -------------------------------------------------------------------
    def _check_alive(self) -> None:
        if self._dead_reason is not None:
            raise self._died("")
        if self.container is None:
            raise SandboxError(f"sandbox {self.spec.name} is not running")

    def _died(self, why: str) -> SandboxDied:
        return SandboxDied(f"sandbox {self.spec.name} died: {self._dead_reason or why}")

    async def exec(self, command: str, timeout: float | None = None, cwd: str | None = None,
                   env: Mapping[str, str] | None = None, user: str | int | None = None,
                   ) -> ExecResult:
        self._check_alive()
        limit = self._effective_timeout(timeout)
        # `timeout` puts the command in its own process group and kills the group at the limit.
        wrapped = ["timeout", "-s", "KILL", f"{limit:.3f}", "bash", "-c", command]
        started = time.monotonic()
        try:
            code, out, err = await asyncio.wait_for(asyncio.to_thread(
                self._exec_blocking, wrapped, cwd, env, user), timeout=limit + 30)
        except TimeoutError:
            raise SandboxError(f"sandbox {self.spec.name} stopped answering") from None
        self._check_alive()  # the watchdog may have ended the container under this command
        duration = time.monotonic() - started
        timed_out = code == 137 and duration >= limit - 0.05
        return ExecResult(-1 if timed_out else code, out, err, timed_out, duration)

    def _exec_blocking(self, argv, cwd, env, user) -> tuple[int, str, str]:
        """Run argv in the container, streaming its output into head-and-tail buffers."""
        import docker
        api = self.client.api
        outputs = [HeadTail(self.spec.max_output_bytes), HeadTail(self.spec.max_output_bytes)]
        try:
            exec_id = api.exec_create(self.running.id, argv, workdir=cwd or self.spec.workdir,
                                      environment=dict(env or {}),
                                      user="" if user is None else str(user))["Id"]
            for out, err in api.exec_start(exec_id, stream=True, demux=True):
                if out:
                    outputs[0].add(out)
                if err:
                    outputs[1].add(err)
            code = api.exec_inspect(exec_id)["ExitCode"]
        except docker.errors.NotFound:
            raise self._died("its container is gone") from None
        except docker.errors.APIError as exc:
            if exc.status_code == 409:  # "container ... is not running"
                raise self._died(str(exc.explanation)) from None
            raise SandboxError(f"engine error in {self.spec.name}: {exc.explanation}") from None
        if code is None:
            raise self._died("its command never finished")
        stdout, stderr = (kept.value().decode(errors="replace") for kept in outputs)
        return code, stdout, stderr

    async def extract(self, archive: bytes, remote_dir: str) -> None:
        made = await self.exec(f"mkdir -p {shlex.quote(remote_dir)}", timeout=60, cwd="/",
                               user=0)
        if not made.ok:
            raise SandboxError(f"unpacking into {remote_dir} failed: "
                               f"{(made.stderr or made.stdout).strip()[-300:]}")
        await asyncio.to_thread(self.running.put_archive, remote_dir, archive)

    def _from_archive(self, remote: str, consume: Callable[[Iterable[bytes]], T]) -> T | None:
        """`consume` over the engine's archive of `remote`; None when the path does not exist.
        A cut or garbled stream is the engine's failure, not the agent's."""
        import docker
        import requests
        self._check_alive()
        api = self.client.api
        try:
            # get_archive's own stream, with its response in hand: a reader that stops early
            # (a limit, a deadline) closes the connection, or the engine blocks on the unread
            # archive and the container cannot be removed for minutes.
            response = api._get(api._url("/containers/{0}/archive", self.running.id),
                                params={"path": remote}, stream=True,
                                headers={"Accept-Encoding": "identity"})
            try:
                api._raise_for_status(response)
                return consume(response.iter_content(1 << 20, False))
            finally:
                response.close()
        except docker.errors.NotFound:
            if self._dead_reason is not None:
                raise self._died("") from None
            return None
        except docker.errors.APIError as exc:
            raise SandboxError(f"engine error in {self.spec.name}: {exc.explanation}") from None
        except (tarfile.TarError, requests.RequestException) as exc:
            raise SandboxError(f"reading files of {self.spec.name} failed: {exc}") from None

    async def read_file(self, remote: str, limit: int = FILE_READ_LIMIT) -> bytes | None:
        return await asyncio.to_thread(
            self._from_archive, remote, lambda stream: read_tar_file(stream, remote, limit))

    async def collect(self, remote: str, writer: BundleWriter) -> bool:
        def consume(stream: Iterable[bytes]) -> bool:
            collect_tar_stream(stream, remote, writer)
            return True
        # Not asyncio.to_thread: that pool runs every sample's commands (exec above).
        return await run_collection(
            writer, lambda: self._from_archive(remote, consume)) is not None

    def network_namespace(self) -> str:
        container = self.running
        container.reload()  # the pid is known once the container runs
        pid = container.attrs.get("State", {}).get("Pid") or 0
        if pid <= 0:
            raise SandboxError(f"sandbox {self.spec.name} has no running process")
        return f"/proc/{pid}/ns/net"

    async def kill_processes(self) -> None:
        self._check_alive()
        # Frozen by us, not `docker pause`: runc gives up freezing a fork bomb ("unable to
        # freeze"), where retrying FROZEN until it holds does not.
        keeper, group = await asyncio.to_thread(self._keeper_and_group)
        if group is not None:
            if not await asyncio.to_thread(end_processes, group, frozenset({keeper})):
                raise SandboxDied(f"sandbox {self.spec.name}: processes could not be killed")
            return
        # Not under `timeout` as exec() runs commands: kill -1 would end that wrapper too.
        code, out, _ = await asyncio.wait_for(asyncio.to_thread(
            self._exec_blocking, ["bash", "-c", KILL_ALL], "/", None, 0), timeout=60)
        if code != 0:
            raise SandboxDied(f"sandbox {self.spec.name}: processes could not be killed "
                              f"({out.strip()})")

    def _keeper_and_group(self) -> tuple[int, Path | None]:
        """The keeper's host pid, and its cgroup folder if this host can freeze it."""
        import docker
        try:
            keeper = int(self.client.api.inspect_container(self.running.id)["State"]["Pid"])
        except docker.errors.NotFound:
            raise self._died("its container is gone") from None
        if keeper <= 0:  # the container is not running
            raise self._died("its container stopped")
        return keeper, cgroup_of(keeper, owner=self.running.id)

    async def stop(self) -> None:
        """Never raises: a container that could not be removed (no engine, no descriptor left
        even with the reserve) is logged and ends at its deadline (KEEPER), or is removed by
        the next run's reaper."""
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self.container is None:
            return
        container, self.container = self.container, None
        await clean_up(f"sandbox {self.name}: removing its container",
                       lambda: self._remove(container))

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
    # The listing's own labels, not one inspect per container: another run's sandbox may be
    # removed between the listing and its inspection.
    for summary in client.api.containers(all=True, filters={"label": LABEL}):
        deadline = float((summary.get("Labels") or {}).get(f"{LABEL}.deadline", "inf"))
        if deadline < time.time():
            DockerSandbox._remove(client.containers.prepare_model(summary))
            removed += 1
    return removed
