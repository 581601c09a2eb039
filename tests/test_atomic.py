"""The ground floor's atomic writes: a writer SIGKILLed at random points leaves the target old,
absent or complete, never partial, and its staging is removed by the next write. The same kill
loop against a plain open()/write() writer does leave partial targets, so it tells them apart."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event
from pathlib import Path

import pytest

from skyrl_agent.atomic import (
    MARK,
    atomic_file,
    atomic_folder,
    atomic_write_bytes,
    atomic_write_text,
    clean_stale_staging,
    staging_path,
)

CHUNK = 256 * 1024
CHUNKS = 24
FILES = 40
KILLS = 6


def _atomic_file(target: Path, version: int) -> None:
    with atomic_file(target) as staging, open(staging, "wb") as out:
        for _ in range(CHUNKS):
            out.write(bytes([version]) * CHUNK)


def _naive_file(target: Path, version: int) -> None:
    with open(target, "wb") as out:
        for _ in range(CHUNKS):
            out.write(bytes([version]) * CHUNK)
            out.flush()


def _atomic_folder(target: Path, version: int) -> None:
    with atomic_folder(target, replace=True) as staging:
        for i in range(FILES):
            (staging / f"{i}.bin").write_bytes(bytes([version]) * CHUNK)


def _naive_folder(target: Path, version: int) -> None:
    target.mkdir(exist_ok=True)
    for i in range(FILES):
        (target / f"{i}.bin").write_bytes(bytes([version]) * CHUNK)


WRITERS = {"atomic file": _atomic_file, "naive file": _naive_file,
           "atomic folder": _atomic_folder, "naive folder": _naive_folder}


def _rewrite_forever(kind: str, target: Path, ready: Event) -> None:
    """Rewrite the target version after version; every byte of a version is its number, so a
    reader can tell a complete target from a torn one."""
    ready.set()
    version = 0
    while True:
        version = version % 255 + 1
        WRITERS[kind](target, version)


def _writer(kind: str, target: Path) -> BaseProcess:
    fork = multiprocessing.get_context("fork")  # starts in a millisecond, unlike an interpreter
    ready = fork.Event()
    process = fork.Process(target=_rewrite_forever, args=(kind, target, ready), daemon=True)
    process.start()
    assert ready.wait(10)
    return process


def _whole(data: bytes, size: int) -> bool:
    return len(data) == size and data == data[:1] * size


def _target_is_whole(target: Path, folder: bool) -> bool:
    """Absent, or complete: one version throughout, every byte and (folders) every file."""
    if not target.exists():
        return True
    if not folder:
        return _whole(target.read_bytes(), CHUNK * CHUNKS)
    files = sorted(target.iterdir())
    contents = b"".join(f.read_bytes()[:1] for f in files)
    return (len(files) == FILES and all(_whole(f.read_bytes(), CHUNK) for f in files)
            and _whole(contents, FILES))


def _kill_loop(kind: str, tmp_path: Path) -> tuple[int, int]:
    """Kill a writer KILLS times at random points; (torn targets seen, stale stagings seen).
    After each kill an atomic write of the same target must remove the dead writer's staging."""
    tmp_path.mkdir()
    target = tmp_path / "target"
    folder = "folder" in kind
    torn = stale = 0
    chance = random.Random(31)
    for _ in range(KILLS):
        process = _writer(kind, target)
        time.sleep(chance.uniform(0.0, 0.1))
        assert process.pid is not None
        os.kill(process.pid, signal.SIGKILL)
        process.join()  # reaped: its pid is gone, so its staging is stale
        torn += not _target_is_whole(target, folder)
        leftovers = list(tmp_path.glob(f".target{MARK}*"))
        stale += bool(leftovers)
        if "atomic" in kind:  # the next write cleans the dead writer's staging
            if folder:
                with atomic_folder(target, replace=True) as staging:
                    for i in range(FILES):
                        (staging / f"{i}.bin").write_bytes(b"\0" * CHUNK)
            else:
                atomic_write_bytes(target, b"\0" * CHUNK * CHUNKS)
            assert list(tmp_path.glob(f".target{MARK}*")) == []
    return torn, stale


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_killed_writer_never_leaves_a_partial_target(tmp_path, kind):
    """Stops: a writer killed mid-way (an OOM-killed trainer, a SIGKILLed rollout) leaving a
    half-written checkpoint, model, task or trajectory shard that a later run takes as whole,
    and its staging piling up. The naive writer shows the loop does catch torn targets."""
    torn, stale = _kill_loop(f"atomic {kind}", tmp_path / "atomic")
    assert torn == 0
    assert stale > 0  # the kills did land mid-write
    naive_torn, _ = _kill_loop(f"naive {kind}", tmp_path / "naive")
    assert naive_torn > 0


def test_data_and_parent_are_fsynced(tmp_path, fsynced):
    """Stops: a power loss after the write returned losing it (renamed but never flushed, or
    the rename itself not on disk): the file's data, every folder's files, and the parent."""
    atomic_write_text(tmp_path / "a.txt", "hello")
    assert fsynced[0].startswith(str(tmp_path / f".a.txt{MARK}")) and fsynced[1] == str(tmp_path)
    fsynced.clear()
    with atomic_folder(tmp_path / "f") as staging:
        (staging / "sub").mkdir()
        (staging / "sub" / "x").write_text("x")
    assert {Path(p).name for p in fsynced[:-1]} >= {"x", "sub"} and fsynced[-1] == str(tmp_path)
    assert (tmp_path / "f" / "sub" / "x").read_text() == "x"


def test_folder_race_first_writer_wins_unless_replace(tmp_path):
    """Stops: a second writer of a content-addressed folder tearing the first one's out from
    under a reader; `replace=True` (checkpoints, exports) lets the newest win instead."""
    target = tmp_path / "task"
    with atomic_folder(target) as first, atomic_folder(target) as second:
        (second / "who").write_text("second")
        (first / "who").write_text("first")
    assert (target / "who").read_text() == "second"  # it was published first
    with atomic_folder(target, replace=True) as third:
        (third / "who").write_text("third")
    assert (target / "who").read_text() == "third"
    assert [p.name for p in tmp_path.iterdir()] == ["task"]


def test_failed_write_leaves_the_target_and_no_staging(tmp_path):
    target = tmp_path / "a.txt"
    atomic_write_text(target, "old")
    with pytest.raises(RuntimeError), atomic_file(target) as staging:
        staging.write_text("new, half")
        raise RuntimeError("writer failed")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_clean_up_spares_live_writers(tmp_path):
    """A sweep removes only stagings whose writer is gone: a live writer keeps its own."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = staging_path(tmp_path / "x", pid=dead.pid)
    alive = staging_path(tmp_path / "x", pid=os.getppid())
    mine = staging_path(tmp_path / "x")
    for path in (gone, alive, mine):
        path.write_text("partial")
    assert clean_stale_staging(tmp_path) == [gone]
    assert alive.exists() and mine.exists()
