"""The `local` backend: a bubblewrap sandbox, no daemon needed.

Layout: the sandbox's root is a private host folder (its `/app`, `/logs`, `/tmp`, `/root`, ...
live there); the host's /usr and a short list of /etc files are mounted read-only on top; nothing
else of the host is visible. Every namespace is unshared (a public task's network namespace
reaches out through slirp4netns, never to the host's loopback: see local_net.py),
all capabilities are dropped, the host environment is cleared, and sandbox root is an unprivileged
host user (nobody, or the caller when not root). One long-lived process (exec_server.py) runs
commands, so all commands share one PID namespace; it is that namespace's PID 1 and not
dumpable, so agent commands cannot signal, trace or rob it (see exec_server.py). Killing it, at
stop() or at the deadline, kills every process the sandbox started.

Disk: as root, the sandbox's root folder is a fresh ext4 file system on a sparse loop file of
`storage_mb`, so a full disk stops the agent, not the host. Without root (or loop devices),
rlimits stand in: file size, address space, process count and CPU time.

Files leave the sandbox only through artifacts.py: the host reads the root folder itself, one
directory fd at a time, never following a link.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import marshal
import os
import secrets
import shlex
import shutil
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from skyrl_agent.descriptors import clean_up, prepare
from skyrl_agent.sandboxes.artifacts import (
    BundleWriter,
    collect_tree,
    read_tree_file,
    run_collection,
)
from skyrl_agent.sandboxes.base import (
    FILE_READ_LIMIT,
    ExecResult,
    Sandbox,
    SandboxDied,
    SandboxError,
    UnsupportedEnvironment,
)
from skyrl_agent.sandboxes.cgroups import Cgroup, cgroups_available
from skyrl_agent.sandboxes.local_disk import (
    can_mount,
    mount_disk,
    remove_tree,
    sandbox_folder_name,
    sandboxes_folder,
    unmount,
)
from skyrl_agent.sandboxes.local_files import (
    chown_tree,
    clear_on_host,
    host_system_file,
    read_host_file,
    require_traversable,
)
from skyrl_agent.sandboxes.local_kill import kill_sandbox
from skyrl_agent.sandboxes.local_net import (
    RESOLV_CONF,
    SandboxNetwork,
    require_slirp4netns,
    sandbox_init_pid,
    write_resolv_conf,
)
from skyrl_agent.sandboxes.local_plan import LocalPlan, plan_local

log = logging.getLogger(__name__)
SANDBOX_UID = 65534  # host uid that sandbox root maps to when skyrl-agent runs as root
SERVER_SOURCE = (Path(__file__).parent / "exec_server.py").read_text()
SERVER_PATH = Path("/.skyrl/exec_server.py")  # where the sandbox sees it
ETC_ENTRIES = ("passwd", "group", "hosts", "nsswitch.conf", "host.conf", "ld.so.cache",
               "ld.so.conf", "ld.so.conf.d", "alternatives", "ssl", "ca-certificates",
               "ca-certificates.conf", "localtime", "timezone", "profile", "profile.d",
               "bash.bashrc", "inputrc", "terminfo", "mime.types", "os-release", "debian_version",
               "python3", "python3.11", "python3.12", "gitconfig", "login.defs", "protocols",
               "services", "magic", "tmux.conf", "vim")
BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root", "TERM": "xterm-256color", "LANG": "C.UTF-8", "USER": "root"}
EXTRACT_OUTPUT = 65536  # what tar may say when unpacking


@dataclass(frozen=True)
class _Reply:
    """One exec-server reply, as read from the pipe."""

    request_id: int
    exit_code: int
    timed_out: bool
    duration_s: float
    stdout: bytes
    stderr: bytes


async def _to_thread_to_the_end(function: Callable[..., None], *args: object) -> None:
    """Run `function` in a thread; when cancelled, let it finish before re-raising, so that
    stop() sees everything it did (a disk mounted after stop() ran would never be unmounted)."""
    future = asyncio.ensure_future(asyncio.to_thread(function, *args))
    try:
        await asyncio.shield(future)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await future
        raise


class LocalSandbox(Sandbox):
    """A bubblewrap sandbox on this machine."""

    def __init__(self, spec, config=None) -> None:
        super().__init__(spec, config)
        self.id = f"{spec.name.replace('/', '-')[:40]}-{uuid.uuid4().hex[:8]}"
        self._dir: Path | None = None
        self._cgroup: Cgroup | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._plan: LocalPlan | None = None
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._dead_reason: str | None = None
        self._net: SandboxNetwork | None = None
        self._mounted = False
        self.server_pid: int | None = None
        self._own_pids: frozenset[int] = frozenset()  # host pids of bwrap and the exec server

    @property
    def root(self) -> Path:
        """The host folder that is the sandbox's `/`."""
        assert self._dir is not None, "sandbox not started"
        return self._dir / "root"

    @property
    def cgroup(self) -> Cgroup | None:
        return self._cgroup

    async def start(self) -> None:
        if shutil.which("bwrap") is None:
            raise UnsupportedEnvironment(
                "bubblewrap (bwrap) is not installed: run scripts/setup.sh as root, "
                "or apt-get install bubblewrap")
        if self.spec.network:
            require_slirp4netns()
        prepare()  # the host's open-file limit raised, its reserve held (descriptors.py)
        self._plan = plan_local(self.spec)
        base = sandboxes_folder(self.config.work_root)
        base.mkdir(parents=True, exist_ok=True)
        self._dir = base / sandbox_folder_name(self.id)
        self._dir.mkdir()
        self._dir.chmod(0o711)  # the unprivileged sandbox user must reach root/ to mount it
        if os.geteuid() == 0:
            require_traversable(base)
        await _to_thread_to_the_end(self._mount_disk)
        await _to_thread_to_the_end(self._prepare_root, self._plan)
        if self.spec.network:
            write_resolv_conf(self.root.parent)
        if cgroups_available():
            self._cgroup = Cgroup.create(self.id, self.spec.memory_mb, self.spec.pids_limit,
                                         self.spec.cpus)
        self._proc = await asyncio.create_subprocess_exec(
            *self._command(self._plan), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, limit=2**31 - 1,
            env={"PATH": BASE_ENV["PATH"]})  # pid 1 inside keeps this environ: no host values
        self._started_at = time.monotonic()
        self.server_pid = await self._wait_ready()
        if self._cgroup is not None:  # before any command runs: only the sandbox's own are in it
            self._own_pids = frozenset(self._cgroup.procs())
        if self.spec.network:  # up before the first command of the task runs
            self._net = await SandboxNetwork.attach(sandbox_init_pid(self._proc.pid),
                                                     self.root.parent)
        self._reader = asyncio.create_task(self._read_replies())
        self._deadline_timer = asyncio.get_running_loop().call_later(
            self.spec.deadline_s, self._kill, "deadline")
        for cwd, command in self._plan.run_steps:
            result = await self.exec(command, cwd=cwd, timeout=self.remaining_s())
            if not result.ok:
                raise SandboxError(f"Dockerfile RUN step failed in {self.spec.name} "
                                   f"(exit {result.exit_code}): {result.stderr[-500:]}")

    def _mount_disk(self) -> None:
        """Make root/ a disk of its own where that works; else a plain folder (RLIMIT_FSIZE)."""
        assert self._dir is not None
        self.root.mkdir()
        if can_mount():
            mount_disk(self._dir / "disk.img", self.root, self.spec.storage_mb)
            self._mounted = True

    def _prepare_root(self, plan: LocalPlan) -> None:
        root = self.root
        for sub in ("usr", "etc", "proc", "dev", "root", "home", "var/tmp", "logs/agent",
                    "logs/verifier"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        (root / "tmp").mkdir(mode=0o1777)
        for directory in plan.directories:
            (root / directory.lstrip("/")).mkdir(parents=True, exist_ok=True)
        for step in plan.copies:
            target = root / step.destination.lstrip("/")
            if step.into_directory and not step.source.is_dir():
                target = target / step.source.name
            if step.source.is_dir():
                shutil.copytree(step.source, target, dirs_exist_ok=True, symlinks=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(step.source, target)
        if os.geteuid() == 0:
            chown_tree(root, SANDBOX_UID)
            for stage in self._mount_sources().values():  # owned by us, outside root/
                Path(stage).mkdir(mode=0o755, parents=True)
        # Written after the chown: owned by the caller, so the sandbox can read but not change it.
        server_dir = root / SERVER_PATH.parent.relative_to("/")
        server_dir.mkdir(mode=0o755)
        (server_dir / SERVER_PATH.name).write_text(SERVER_SOURCE)

    def _bwrap_args(self, plan: LocalPlan) -> list[str]:
        args = ["bwrap", "--die-with-parent", "--new-session", "--unshare-all", "--unshare-user",
                "--as-pid-1",
                "--uid", "0", "--gid", "0", "--hostname", "sandbox", "--bind", str(self.root), "/",
                "--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev"]
        for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            host = Path("/") / top
            if host.is_symlink():
                args += ["--symlink", os.readlink(host), f"/{top}"]
            elif host.is_dir():
                args += ["--ro-bind", str(host), f"/{top}"]
        for entry in ETC_ENTRIES:
            if os.path.lexists(f"/etc/{entry}"):
                args += ["--ro-bind", f"/etc/{entry}", f"/etc/{entry}"]
        if self.spec.network:
            args += ["--ro-bind", str(self.root.parent / RESOLV_CONF), "/etc/resolv.conf"]
        for inside, source in self._mount_sources().items():
            args += ["--ro-bind", source, inside]
        args += ["--clearenv"]
        for key, value in {**BASE_ENV, **plan.env}.items():
            args += ["--setenv", key, value]
        args += ["--chdir", plan.workdir, "--cap-drop", "ALL"]
        return args

    def _command(self, plan: LocalPlan) -> list[str]:
        server = ["/usr/bin/python3", "-I", "-S", str(SERVER_PATH), str(self.spec.deadline_s)]
        command = [*self._bwrap_args(plan), "--", *server]
        if os.geteuid() == 0:
            command = ["setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}",
                       "--clear-groups", *command]
            command = self._staged_mounts(command)
        limits = self._rlimits()
        if limits:
            command = ["prlimit", *limits, "--", *command]
        if self._cgroup is not None:
            joins = " && ".join(f"echo $$ > {shlex.quote(str(f))}"
                                for f in self._cgroup.procs_files)
            command = ["/bin/sh", "-c", f'{joins} && exec "$@"', "sh", *command]
        return command

    def _mount_sources(self) -> dict[str, str]:
        """Sandbox path -> the folder bwrap binds there. bwrap runs as the unprivileged sandbox
        user when we are root, and that user may not reach a source (e.g. under root's home),
        so there each source is bound first onto a stage of its own in the sandbox's folder,
        in a mount namespace private to the sandbox's processes (_staged_mounts)."""
        mounts = self.spec.read_only_mounts
        if os.geteuid() != 0:
            return dict(mounts)
        assert self._dir is not None
        return {inside: str(self._dir / "mounts" / str(i)) for i, inside in enumerate(mounts)}

    def _staged_mounts(self, command: list[str]) -> list[str]:
        """`command` in a private mount namespace where each read-only mount's source is bound
        onto its stage (the host's mounts stay as they are; the binds end with the sandbox)."""
        if not self.spec.read_only_mounts:
            return command
        stages = self._mount_sources()
        binds = " && ".join(
            f"mount --bind -- {shlex.quote(source)} {shlex.quote(stages[inside])}"
            for inside, source in self.spec.read_only_mounts.items())
        return ["unshare", "--mount", "--propagation", "private", "--",
                "/bin/sh", "-c", f'{binds} && exec "$@"', "sh", *command]

    def _rlimits(self) -> list[str]:
        """prlimit options: disk per file where no loop disk is mounted; without cgroups also
        address space, processes, and CPU seconds (the cpus share over the whole lifetime)."""
        limits = [] if self._mounted else [f"--fsize={self.spec.storage_mb * 1024 * 1024}"]
        if self._cgroup is None:
            cpu_seconds = int(self.spec.cpus * self.spec.deadline_s) + 1
            limits += [f"--as={self.spec.memory_mb * 1024 * 1024}",
                       f"--nproc={self.spec.pids_limit}", f"--cpu={cpu_seconds}"]
        return limits

    async def _wait_ready(self) -> int:
        """The exec server's pid, once it says it is ready."""
        assert self._proc is not None
        assert self._proc.stdout is not None and self._proc.stderr is not None  # both piped
        try:
            line = await asyncio.wait_for(self._proc.stdout.readline(), timeout=30)
        except TimeoutError:
            line = b""
        word, _, pid = line.decode(errors="replace").partition(" ")
        if word != "ready" or not pid.strip().isdigit():
            if self._proc.returncode is None:
                kill_sandbox(self._proc)  # its child too, or stderr would never end
            stderr = (await self._proc.stderr.read()).decode(errors="replace").strip()
            raise SandboxError(f"local sandbox for {self.spec.name} did not start: "
                               f"{stderr.splitlines()[-1] if stderr else 'no output'}")
        return int(pid)

    async def _read_reply(self) -> _Reply | None:
        """The next reply (see exec_server.py for its format); None at EOF.

        Whatever runs in the sandbox can write to this pipe, so the format is text and lengths,
        parsed strictly, and never unmarshalled.
        """
        assert self._proc is not None and self._proc.stdout is not None
        try:
            header = await self._proc.stdout.readline()
            if not header:
                return None
            fields = header.split()
            if len(fields) != 6:
                raise ValueError(header[:80])
            request_id, exit_code, timed_out = int(fields[0]), int(fields[1]), fields[2] == b"1"
            duration_s, out_len, err_len = float(fields[3]), int(fields[4]), int(fields[5])
            # No stream of a reply is longer than the largest max_output asked, plus its marker.
            limit = max(self.spec.max_output_bytes, EXTRACT_OUTPUT) + 1024
            if not 0 <= out_len <= limit or not 0 <= err_len <= limit:
                raise ValueError(f"reply of {out_len} + {err_len} bytes")
            stdout = await self._proc.stdout.readexactly(out_len)
            stderr = await self._proc.stdout.readexactly(err_len)
        except asyncio.IncompleteReadError:
            return None
        except ValueError as exc:
            self._kill(f"its exec server sent a malformed reply ({exc})")
            return None
        return _Reply(request_id, exit_code, timed_out, duration_s, stdout, stderr)

    async def _read_replies(self) -> None:
        while (reply := await self._read_reply()) is not None:
            future = self._pending.pop(reply.request_id, None)
            if future is None:  # only replies to requests we sent are taken
                self._kill(f"its exec server answered request {reply.request_id}, never sent")
                break
            if not future.done():
                future.set_result(reply)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(self._dead_error())
        self._pending.clear()

    def _dead_error(self) -> SandboxError:
        """Why requests fail now: a host decision (stop, deadline) is a SandboxError; a server
        that exited or misbehaved on its own is SandboxDied (what runs inside can cause it)."""
        reason = self._dead_reason or "its exec server exited"
        if self._dead_reason in ("stopped", "deadline"):
            return SandboxError(f"sandbox {self.spec.name} is not running ({reason})")
        return SandboxDied(f"sandbox {self.spec.name} died: {reason}")

    def _kill(self, reason: str) -> None:
        if self._dead_reason is None:
            self._dead_reason = reason
        if self._proc is not None and self._proc.returncode is None:
            kill_sandbox(self._proc)  # bubblewrap alone may leave its child: local_kill.py
        if self._cgroup is not None:
            self._cgroup.end_processes(wait=False)

    async def _request(self, message: dict, wait_s: float) -> _Reply:
        if self._proc is None:
            raise SandboxError(f"sandbox {self.spec.name} is not started")
        if self._dead_reason is not None or self._proc.returncode is not None:
            raise self._dead_error()
        request_id = secrets.randbits(62)  # unguessable: a forged reply cannot match
        future = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        assert self._proc.stdin is not None
        payload = marshal.dumps({"id": request_id, **message}, 4)
        try:
            self._proc.stdin.write(len(payload).to_bytes(4, "big") + payload)
            await self._proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            self._pending.pop(request_id, None)
            raise self._dead_error() from None
        try:
            return await asyncio.wait_for(future, timeout=wait_s)
        except TimeoutError:
            self._pending.pop(request_id, None)
            raise SandboxError(f"sandbox {self.spec.name} stopped answering") from None

    async def exec(self, command: str, timeout: float | None = None, cwd: str | None = None,
                   env: Mapping[str, str] | None = None, user: str | int | None = None,
                   ) -> ExecResult:
        if user not in (None, "root", 0, "0"):
            raise UnsupportedEnvironment(
                f"the local sandbox runs everything as root, not as {user!r}; use --sandbox docker")
        reply = await self._exec(command, timeout, cwd, env, None, self.spec.max_output_bytes)
        return ExecResult(exit_code=reply.exit_code, stdout=reply.stdout.decode(errors="replace"),
                          stderr=reply.stderr.decode(errors="replace"),
                          timed_out=reply.timed_out, duration_s=reply.duration_s)

    async def _exec(self, command: str, timeout: float | None, cwd: str | None,
                    env: Mapping[str, str] | None, stdin: bytes | None,
                    max_output: int) -> _Reply:
        """Run a command and return its raw reply."""
        assert self._plan is not None
        limit = self._effective_timeout(timeout)
        message = {"cmd": command, "cwd": cwd or self._plan.workdir, "env": dict(env or {}),
                   "timeout": limit, "max_output": max_output, "stdin": stdin}
        return await self._request(message, wait_s=limit + 10)

    async def extract(self, archive: bytes, remote_dir: str) -> None:
        await self.extract_replacing(archive, remote_dir, ())

    async def extract_replacing(self, archive: bytes, remote_dir: str,
                                replaced: Sequence[str]) -> None:
        # One command, each step only when needed: a process less is ~1.5 ms off a hand-over.
        directory = shlex.quote(remote_dir)
        inside = await asyncio.to_thread(clear_on_host, self.root, replaced) if replaced else []
        clear = f"rm -rf -- {shlex.join(inside)} && " if inside else ""
        make = f"mkdir -p {directory} && " if remote_dir.rstrip("/") else ""
        result = await self._exec(
            f"{clear}{make}exec tar -xf - -C {directory} --no-same-owner",
            timeout=120, cwd="/", env=None, stdin=archive, max_output=EXTRACT_OUTPUT)
        if result.exit_code != 0 or result.timed_out:
            raise SandboxError(f"unpacking into {remote_dir} failed: "
                               f"{result.stderr.decode(errors='replace').strip()[-300:]}")

    async def read_file(self, remote: str, limit: int = FILE_READ_LIMIT) -> bytes | None:
        host = host_system_file(remote)
        if host is not None:  # the host's read-only /usr is seen through a bind mount
            return await asyncio.to_thread(read_host_file, host, limit)
        return await asyncio.to_thread(read_tree_file, self.root, remote, limit)

    async def collect(self, remote: str, writer: BundleWriter) -> bool:
        return await run_collection(writer, lambda: collect_tree(self.root, remote, writer))

    def network_namespace(self) -> str:
        if self._proc is None or self._proc.returncode is not None:
            raise SandboxError(f"sandbox {self.spec.name} is not running")
        return f"/proc/{sandbox_init_pid(self._proc.pid)}/ns/net"

    def end(self, reason: str) -> None:
        try:
            self._kill(reason)
        except OSError as exc:  # its cgroup's files: the exec server is dead, and all with it
            log.warning("sandbox %s: ending its processes: %s", self.id, exc)

    async def kill_processes(self) -> None:
        if self._cgroup is not None and self._cgroup.freezable:  # certain: see cgroups.py
            alive = self._proc is not None and self._proc.returncode is None
            if self._dead_reason is not None or not alive:
                raise self._dead_error()
            if not await asyncio.to_thread(self._cgroup.end_processes, self._own_pids):
                self._kill("its processes outlived a frozen SIGKILL")
                raise SandboxDied(f"sandbox {self.spec.name}: processes could not be killed")
            return
        # Without the freezer (not root): what this fallback guarantees is in cgroups.py.
        reply = await self._request({"op": "killall"}, wait_s=30)
        if reply.exit_code != 0:  # still forking after 2 s of SIGKILL: end the sandbox itself
            self._kill(f"its processes outlived killall ({reply.stdout.decode().strip()})")
            raise SandboxDied(f"sandbox {self.spec.name}: processes could not be killed")

    async def stop(self) -> None:
        """Never raises, whatever failed before (descriptors run out included: the clean-up
        steps get the process's reserve, descriptors.py). A step that still fails is logged;
        what it left stays for the reaper, whose folder name says this process owns it."""
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        try:
            self._kill("stopped")
        except OSError as exc:  # its cgroup's files: its processes die with the cgroup below
            log.warning("sandbox %s: ending its processes: %s", self.id, exc)
        if self._proc is not None:
            await self._proc.wait()
        if self._reader is not None:
            with contextlib.suppress(Exception):
                await self._reader
        if self._net is not None:
            net, self._net = self._net, None
            try:
                await net.close()
            except Exception as exc:  # noqa: BLE001 - it also exits when this process does
                log.warning("sandbox %s: stopping its network: %s", self.id, exc)
        if self._cgroup is not None:
            if not await clean_up(f"sandbox {self.id}: removing its cgroup", self._cgroup.remove):
                # Keep the folder (it names its owner): the next run's reaper retries.
                log.warning("sandbox %s: its cgroup stayed busy; left for the reaper", self.id)
                return
            self._cgroup = None
        if self._mounted:
            root = self.root
            if not await clean_up(f"sandbox {self.id}: unmounting its disk",
                                  lambda: unmount(root)):
                return  # never rmtree into a disk still mounted: the reaper unmounts it
            self._mounted = False
        if self._dir is not None:
            folder = self._dir
            await clean_up(f"sandbox {self.id}: removing its folder", lambda: remove_tree(folder))
