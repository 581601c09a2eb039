"""Stopping on SIGTERM: inside a coroutine (the work is cancelled, its clean-ups finish) and
across a stage's child process (a stopped parent stops the child and waits for its clean-ups,
so no trainer keeps running with its sandboxes and model server after its run was stopped)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from skyrl_agent.errors import RunStopped
from skyrl_agent.stopping import in_child, run_until_stopped

ROOT = Path(__file__).resolve().parents[1]


async def _work_with_a_slow_clean_up(folder: Path, stop_self: bool) -> None:
    (folder / "pid").write_text(str(os.getpid()))
    if stop_self:
        asyncio.get_running_loop().call_later(0.2, os.kill, os.getpid(), signal.SIGTERM)
    try:
        await asyncio.sleep(600)
    finally:  # like a sandbox's stop(): shielded, and it takes a moment
        await asyncio.shield(asyncio.sleep(0.5))
        (folder / "cleaned").write_text("yes")


async def _slow_clean_up(folder: Path) -> None:
    await asyncio.sleep(0.5)
    (folder / "cleaned").write_text("yes")


async def _episode_that_ends_and_stops_its_sandbox(folder: Path) -> None:
    try:
        return
    finally:  # like run_episode's shielded sandbox.stop()
        await asyncio.shield(_slow_clean_up(folder))


async def _work_that_stops_while_an_episode_cleans_up(folder: Path) -> None:
    """What `watched` does when the model server dies while an episode stops its sandbox: the
    episode is cancelled (its shielded clean-up goes on as a task of its own) and the run stops
    with RunStopped, not with a cancel."""
    episode = asyncio.create_task(_episode_that_ends_and_stops_its_sandbox(folder))
    await asyncio.sleep(0.1)
    episode.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await episode
    raise RunStopped("the model server exited")


def sleeping_stage(folder: str) -> None:
    run_until_stopped(lambda: _work_with_a_slow_clean_up(Path(folder), stop_self=False))


def _fails(message: str) -> None:
    raise ValueError(message)


def _stops() -> None:
    raise RunStopped("the model server died", exit_code=143)


def _dies() -> None:
    os._exit(9)


def test_sigterm_cancels_the_work_after_its_clean_ups_and_keeps_the_handler(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(RunStopped) as stopped:
        run_until_stopped(lambda: _work_with_a_slow_clean_up(tmp_path, stop_self=True))
    assert stopped.value.exit_code == 143
    assert (tmp_path / "cleaned").read_text() == "yes"
    # asyncio leaves SIG_DFL behind when its loop closes: a later SIGTERM would kill outright
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_run_stopped_by_an_error_still_finishes_the_clean_ups_it_started(tmp_path):
    # Cut short by asyncio.run's final cancel, a sandbox's stop() left its folder behind and its
    # process transport to be collected after the loop closed: a traceback under the stop line.
    with pytest.raises(RunStopped, match="model server exited"):
        run_until_stopped(lambda: _work_that_stops_while_an_episode_cleans_up(tmp_path))
    assert (tmp_path / "cleaned").read_text() == "yes"


def test_a_child_stage_returns_its_result_and_raises_its_error():
    assert in_child(os.getpid) != os.getpid()
    with pytest.raises(ValueError, match="bad seed"):
        in_child(_fails, "bad seed")
    with pytest.raises(RunStopped) as stopped:
        in_child(_stops)
    assert stopped.value.exit_code == 143  # the exit code crosses the process boundary
    with pytest.raises(RunStopped, match="exit code 9"):
        in_child(_dies)


PARENT = textwrap.dedent("""
    import sys
    from skyrl_agent.errors import RunStopped
    from skyrl_agent.stopping import in_child, stop_on_sigterm
    from tests.test_stopping import sleeping_stage

    stop_on_sigterm()
    try:
        in_child(sleeping_stage, sys.argv[1])
    except RunStopped as stopped:
        print(f"stopped: {stopped}", file=sys.stderr)
        sys.exit(stopped.exit_code)
""")


def test_sigterm_to_the_parent_stops_the_child_after_its_clean_ups(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path)], cwd=ROOT,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "pid").exists():
            assert parent.poll() is None, parent.communicate()[1]
            assert time.monotonic() < deadline, "the child stage never started"
            time.sleep(0.1)
        child = int((tmp_path / "pid").read_text())
        parent.send_signal(signal.SIGTERM)
        _, stderr = parent.communicate(timeout=120)
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
    assert parent.returncode == 143, stderr
    assert stderr.strip().splitlines() == ["stopped: terminated by SIGTERM; work already "
                                           "stored is kept"]
    assert (tmp_path / "cleaned").read_text() == "yes"
    assert not Path(f"/proc/{child}").exists(), "the child stage outlived its parent"
