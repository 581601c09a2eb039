"""Resource limits for local sandboxes through cgroup v1 (memory, pids, cpu), where writable,
and the certain kill of a sandbox's processes through the freezer.

Used when skyrl-agent runs as root on a host with cgroup v1 controllers mounted (as on these
machines). Elsewhere the local backend falls back to rlimits (prlimit), which bound address space
and process counts less precisely.

Killing by signalling until a group is empty races its forks: a fork bomb refills the group while
we signal, and under load the loop gives up. Freezing first stops every process at once (a child
forked while the group freezes is born frozen), so one pass of SIGKILL over the frozen list
reaches every process; on thaw none of them runs another instruction of its own.
`end_processes` does this for any freezable group (v1 freezer or v2 cgroup.freeze): a local
sandbox's cgroup, or a container's, found from its main process.

Without a freezer (not root, or no writable freezer), the local backend's exec server, PID 1 of
the sandbox's PID namespace, sends kill(-1) until the namespace is empty: each round is atomic
against fork, but it needs a thread (no room at the pids limit) and gives up after about 2 s,
so a fork bomb can still cost the agent its sample, though it never outlives the kill unseen.
The docker backend without access to the container's cgroup (remote or rootless engine) does the
same from a `docker exec`, which also needs room under the pids limit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids", "cpu")
FREEZER = "freezer"
PARENT = "skyrl-agent"
FREEZE_WAIT_S = 10.0  # a task in uninterruptible sleep delays FROZEN; then we kill regardless
EXIT_WAIT_S = 60.0  # killed processes still run their exit path, throttled by the cpu quota


def cgroups_available() -> bool:
    """True when every controller we use is a writable cgroup v1 hierarchy."""
    return os.geteuid() == 0 and all(
        (CGROUP_ROOT / c / "tasks").is_file() and os.access(CGROUP_ROOT / c, os.W_OK)
        for c in CONTROLLERS)


def _controllers_in_use() -> tuple[str, ...]:
    """The limit controllers, and the freezer where it is mounted and writable."""
    freezer = CGROUP_ROOT / FREEZER
    usable = (freezer / "tasks").is_file() and os.access(freezer, os.W_OK)
    return (*CONTROLLERS, FREEZER) if usable else CONTROLLERS


@dataclass
class Cgroup:
    """One sandbox's cgroup in each controller."""

    name: str
    controllers: tuple[str, ...] = field(default_factory=_controllers_in_use)

    def _dir(self, controller: str) -> Path:
        return CGROUP_ROOT / controller / PARENT / self.name

    @property
    def procs_files(self) -> list[Path]:
        """Files a process writes its pid to, to join this cgroup in every controller."""
        return [self._dir(c) / "cgroup.procs" for c in self.controllers]

    @property
    def freezable(self) -> bool:
        """False for a group made without the freezer (or by a version that did not use it)."""
        return FREEZER in self.controllers and self._dir(FREEZER).is_dir()

    @classmethod
    def create(cls, name: str, memory_mb: int, pids_limit: int, cpus: float) -> Cgroup:
        group = cls(name)
        for controller in group.controllers:
            group._dir(controller).mkdir(parents=True, exist_ok=True)
        memory = str(memory_mb * 1024 * 1024)
        group._write("memory", "memory.limit_in_bytes", memory)
        if (group._dir("memory") / "memory.memsw.limit_in_bytes").exists():
            group._write("memory", "memory.memsw.limit_in_bytes", memory)  # no swap escape
        group._write("pids", "pids.max", str(pids_limit))
        group._write("cpu", "cpu.cfs_period_us", "100000")
        group._write("cpu", "cpu.cfs_quota_us", str(int(cpus * 100000)))
        return group

    def _write(self, controller: str, filename: str, value: str) -> None:
        (self._dir(controller) / filename).write_text(value)

    def pids(self) -> set[int]:
        found: set[int] = set()
        for controller in self.controllers:
            tasks = self._dir(controller) / "tasks"
            if tasks.is_file():
                found.update(int(p) for p in tasks.read_text().split())
        return found

    def procs(self) -> set[int]:
        """Its processes (host pids; a thread group once, unlike `pids`)."""
        return _read_procs(self._dir("pids") / "cgroup.procs")

    def oom_kills(self) -> int:
        """How many processes the kernel killed for passing the memory limit."""
        path = self._dir("memory") / "memory.oom_control"
        if not path.is_file():
            return 0
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def end_processes(self, spare: frozenset[int] = frozenset(), wait: bool = True) -> bool:
        """Kill every process but `spare` (see end_processes); False if some outlived it."""
        if self.freezable:
            return end_processes(self._dir(FREEZER), spare, EXIT_WAIT_S if wait else 0.0)
        # No freezer: signal until the group is empty. A fork bomb can race this loop; the local
        # backend kills its sandbox's PID namespace from inside instead (exec_server.kill_all).
        for _ in range(100):
            pids = self.pids() - spare
            if not pids:
                return True
            _kill_each(pids)
            time.sleep(0.002)
        return not self.pids() - spare

    def remove(self) -> bool:
        """Kill its processes and remove it; False when it stayed busy past the deadline."""
        self.end_processes()
        for controller in self.controllers:
            # Busy until the last killed process is reaped: on a loaded 2-core machine that can
            # take seconds, and giving up early leaks the cgroup.
            deadline = time.monotonic() + 10
            while True:
                try:
                    self._dir(controller).rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        return False
                    time.sleep(0.02)
        return True


def _read_procs(procs: Path) -> set[int]:
    try:
        return {int(p) for p in procs.read_text().split()}
    except FileNotFoundError:  # the group is gone: so are its processes
        return set()


def _kill_each(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
            os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def frozen(group: Path) -> Iterator[bool]:
    """Hold the cgroup folder `group` frozen in the block (v1: its freezer.state; v2: its
    cgroup.freeze); yields whether every task froze within FREEZE_WAIT_S."""
    v1 = (group / "freezer.state").is_file()
    control, on, off = (("freezer.state", "FROZEN", "THAWED") if v1 else
                        ("cgroup.freeze", "1", "0"))
    deadline, done = time.monotonic() + FREEZE_WAIT_S, False
    try:
        with contextlib.suppress(FileNotFoundError):  # no such group: it holds no process
            while not done and time.monotonic() < deadline:
                (group / control).write_text(on)  # v1: writing again retries tasks FREEZING
                done = ((group / control).read_text().strip() == "FROZEN" if v1 else
                        "frozen 1" in (group / "cgroup.events").read_text().splitlines())
                time.sleep(0 if done else 0.001)
        yield done
    finally:
        with contextlib.suppress(FileNotFoundError):
            (group / control).write_text(off)


def end_processes(group: Path, spare: frozenset[int], exit_wait_s: float = EXIT_WAIT_S) -> bool:
    """SIGKILL every process of the cgroup folder `group` but `spare` (host pids), with the
    group frozen, then wait up to `exit_wait_s` for them to be gone.

    Frozen, the group's list is complete and nothing in it can fork (a child forked while it
    freezes is born frozen), so one pass kills every process; on thaw they die without running
    again. A process that appears after a complete pass can only be a child of a spared one (a
    container's keeper starting its `sleep`). Only when the freeze did not complete (a task stuck
    in uninterruptible sleep) can a listed process have forked, and then another pass follows.
    False if a killed process is still listed at the end, or no freeze completed: the caller
    ends the whole sandbox then.
    """
    procs = group / "cgroup.procs"
    deadline = time.monotonic() + exit_wait_s
    while True:
        with frozen(group) as complete:
            killed = _read_procs(procs) - spare
            _kill_each(killed)
        if not killed:
            return True
        pause = 0.001  # most are gone within a millisecond or two; a slow exit backs off
        while killed & _read_procs(procs) and time.monotonic() < deadline:
            time.sleep(pause)
            pause = min(2 * pause, 0.01)
        if complete and not killed & _read_procs(procs):
            return True
        if time.monotonic() >= deadline:
            return False


def cgroup_of(pid: int, owner: str) -> Path | None:
    """The freezable cgroup folder holding `pid` (v1: its freezer's; v2: the unified one), where
    this process may freeze it and signal its members (root); None elsewhere, or when that
    folder's path does not name `owner` (a pid seen from another PID namespace)."""
    if os.geteuid() != 0:
        return None
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    paths = {parts[1]: parts[2] for parts in (line.split(":", 2) for line in lines)
             if len(parts) == 3}  # "<id>:<controllers>:<path>"; v2's controllers are ""
    if FREEZER in paths:
        folder = CGROUP_ROOT / FREEZER / paths[FREEZER].lstrip("/")
        control = "freezer.state"
    elif "" in paths:
        unified = CGROUP_ROOT if (CGROUP_ROOT / "cgroup.controllers").is_file() else (
            CGROUP_ROOT / "unified")
        folder = unified / paths[""].lstrip("/")
        control = "cgroup.freeze"
    else:
        return None
    usable = (folder / control).is_file() and os.access(folder / control, os.W_OK)
    return folder if owner in str(folder) and usable else None


def abandoned_cgroups(min_age_s: float = 60.0) -> list[Cgroup]:
    """Sandbox cgroups without a process, older than `min_age_s`. A live sandbox's exec server
    sits in its cgroup from the first moments to stop(), so only a crashed run's are empty."""
    parent = CGROUP_ROOT / "pids" / PARENT
    if not parent.is_dir():
        return []
    found = []
    for folder in parent.iterdir():
        if folder.is_dir() and time.time() - folder.stat().st_mtime > min_age_s:
            group = Cgroup(folder.name)
            if not group.pids():
                found.append(group)
    return found
