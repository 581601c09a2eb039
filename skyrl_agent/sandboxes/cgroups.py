"""Resource limits for local sandboxes through cgroup v1 (memory, pids, cpu), where writable.

Used when skyrl-agent runs as root on a host with cgroup v1 controllers mounted (as on these
machines). Elsewhere the local backend falls back to rlimits (prlimit), which bound address space
and process counts less precisely.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids", "cpu")
PARENT = "skyrl-agent"


def cgroups_available() -> bool:
    """True when every controller we use is a writable cgroup v1 hierarchy."""
    return os.geteuid() == 0 and all(
        (CGROUP_ROOT / c / "tasks").is_file() and os.access(CGROUP_ROOT / c, os.W_OK)
        for c in CONTROLLERS)


@dataclass
class Cgroup:
    """One sandbox's cgroup in each controller."""

    name: str

    def _dir(self, controller: str) -> Path:
        return CGROUP_ROOT / controller / PARENT / self.name

    @property
    def procs_files(self) -> list[Path]:
        """Files a process writes its pid to, to join this cgroup in every controller."""
        return [self._dir(c) / "cgroup.procs" for c in CONTROLLERS]

    @classmethod
    def create(cls, name: str, memory_mb: int, pids_limit: int, cpus: float) -> Cgroup:
        group = cls(name)
        for controller in CONTROLLERS:
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
        for controller in CONTROLLERS:
            tasks = self._dir(controller) / "tasks"
            if tasks.is_file():
                found.update(int(p) for p in tasks.read_text().split())
        return found

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

    def kill_all(self, attempts: int = 100) -> None:
        """SIGKILL every process left in the cgroup, until none is (a fork bomb may race us)."""
        for _ in range(attempts):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.002)

    def remove(self) -> bool:
        """Kill its processes and remove it; False when it stayed busy past the deadline."""
        self.kill_all()
        for controller in CONTROLLERS:
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
