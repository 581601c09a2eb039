"""Ending a local sandbox's processes where no cgroup holds them (no writable cgroup v1
hierarchy: a container such as a Ray cluster's node, or a caller without root).

Killing bubblewrap alone does not end a sandbox that is still starting. bubblewrap's child (the
sandbox's first process, PID 1 of its PID namespace) arms --die-with-parent only at the end of
its setup, and until its parent tells it to go on (after the clone) it waits on an eventfd
that no death ever signals. Killed in that window (a cancelled start, e.g. at a run's end),
bubblewrap left a child that kept the sandbox's pipes open: stop() waited for them (asyncio's
wait() returns once the pipes close) until the exec server's own deadline timer, or forever. So
the child is killed too, found while bubblewrap is stopped, so that it starts none after the
list is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

STOPPING_S = 0.2
"""How long to wait for SIGSTOP to take effect (microseconds, unless the machine is loaded)."""


def kill_sandbox(bwrap: asyncio.subprocess.Process) -> None:
    """SIGKILL bubblewrap (not yet reaped) and its child; everything else in the sandbox is in
    the child's PID namespace and dies with it."""
    pid = bwrap.pid
    if _stat(pid)[1:] != [str(os.getpid())]:  # not ours (any more): never signal a stranger
        bwrap.kill()
        return
    with contextlib.suppress(ProcessLookupError):  # unreaped, so the pid cannot be reused
        os.kill(pid, signal.SIGSTOP)
        _wait_stopped(pid)
        for child in _children(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        os.kill(pid, signal.SIGKILL)


def _stat(pid: int) -> list[str]:
    """[state, parent pid] of a live process; [] when there is none."""
    try:
        # After the command name, which is in parentheses and may hold spaces.
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[:2]
    except OSError:
        return []


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):  # gone already, or a kernel without the file
        return []


def _wait_stopped(pid: int) -> None:
    deadline = time.monotonic() + STOPPING_S
    while time.monotonic() < deadline and _stat(pid)[:1] not in ([], ["T"], ["t"], ["Z"]):
        time.sleep(0.001)
