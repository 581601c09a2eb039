"""A local sandbox whose start is cancelled (a run's end cancels the samples still starting
theirs) stops at once, where no cgroup holds its processes too: a Ray cluster's Docker node, or a
caller without root. There, stopping bubblewrap alone left its half-started child holding the
sandbox's pipes, and the cancel waited for the sandbox's lifetime, or forever."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import skyrl_agent.sandboxes.local as local
from skyrl_agent.config import SandboxConfig
from skyrl_agent.sandboxes.base import SandboxSpec
from skyrl_agent.sandboxes.local_disk import sandboxes_folder
from skyrl_agent.sandboxes.pool import SandboxPool
from skyrl_agent.tasks import find_task

TRIES = 3
STOP_WITHIN_S = 15.0  # a stop takes well under a second; the lifetime here is 150 s


async def test_a_start_cancelled_mid_setup_stops_at_once_without_cgroups(work_root, monkeypatch):
    """Stops: a run's end that waits for a sandbox cancelled while it starts until the sandbox's
    lifetime ends (the exec server's own deadline timer) or forever (bubblewrap's child waiting
    on its dead parent's eventfd), with that sandbox's processes left running (the Ray cluster
    test's 2-6 minute run end)."""
    monkeypatch.setattr(local, "cgroups_available", lambda: False)
    monkeypatch.setattr(local, "can_mount", lambda: False)  # nothing to unmount if it leaks
    config = SandboxConfig(work_root=work_root)
    spec = SandboxSpec.from_task(find_task("toy/eight-a"), config)
    pool = SandboxPool(config, size=0)
    left: list[int] = []
    try:
        for _ in range(TRIES):
            acquiring = asyncio.create_task(pool.acquire(spec))
            bwrap, child = await _bubblewrap_and_its_child(work_root, acquiring)
            left += [bwrap, child]
            acquiring.cancel()  # as the run's end cancels a sample whose sandbox is starting
            cancelled_at = time.monotonic()
            done, _ = await asyncio.wait({acquiring}, timeout=STOP_WITHIN_S)
            took = time.monotonic() - cancelled_at
            assert done, f"the cancelled start's stop still runs after {took:.0f} s"
            assert acquiring.cancelled()
            alive = [pid for pid in (bwrap, child) if _alive(pid)]
            assert alive == [], f"left running after the stop: {alive}"
        assert list(sandboxes_folder(work_root).iterdir()) == []
    finally:
        for pid in left:  # what a failed run leaked, ended here (our own sandboxes' pids)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


async def _bubblewrap_and_its_child(work_root: Path, acquiring: asyncio.Task) -> tuple[int, int]:
    """The sandbox's bubblewrap (a child of this process) as soon as it has a child of its own:
    the sandbox's first process, still setting up."""
    me = os.getpid()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert not acquiring.done(), "the sandbox started before its setup was seen"
        for pid in _children(me):
            if str(work_root) in _cmdline(pid):
                children = _children(pid)
                if children:
                    return pid, children[0]
        await asyncio.sleep(0.001)
    raise AssertionError("no sandbox setting up within 60 s")


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    """Running (a zombie is dead: an orphan's may wait for a reaper that never comes)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
