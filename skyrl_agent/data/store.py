"""TrajectoryStore: append-only, crash-safe Parquet shards of trajectories in a run directory.

Layout: RUN_DIR/trajectories/shard-NNNNNN-XXXX.parquet plus index.jsonl, one line per live
shard naming the (task, sample) keys it holds. Appending a shard appends one line (O(1) per
trajectory); only compaction rewrites the index.

Crash safety: a shard is written under a temporary name, fsynced, renamed and its folder
fsynced before append() returns; only then is its index line appended and fsynced. A crash
between the two, or a torn last line, leaves a complete shard the index does not name: on open it
is adopted when it holds only new keys, and deleted when its keys are already indexed (a merged
shard from an interrupted compaction). So a finished trajectory is never lost and never counted
twice.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from skyrl_agent.atomic import atomic_file, atomic_write_text, clean_stale_staging
from skyrl_agent.data.run_dir import RunDir
from skyrl_agent.data.schema import from_row, to_table
from skyrl_agent.errors import UserError
from skyrl_agent.types import Trajectory

Key = tuple[str, int]
INDEX = "index.jsonl"


class StoreError(UserError):
    """A run directory or shard that cannot be read; the message names the file."""


@dataclass(frozen=True)
class StoreContents:
    trajectories: list[Trajectory]
    """Every readable trajectory, one per (task, sample), sorted."""
    problems: list[str]
    """One line per shard that could not be read (the others were read)."""


def _index_line(shard: str, keys: list[Key]) -> str:
    return json.dumps({"shard": shard, "keys": keys}) + "\n"


def _shard_keys(path: Path) -> list[Key]:
    table = pq.read_table(path, columns=["task_id", "sample_index"])
    return list(zip(table["task_id"].to_pylist(), table["sample_index"].to_pylist(), strict=True))


class TrajectoryStore:
    """The trajectories of one run directory. Open it with `writable=True` to append."""

    def __init__(self, run_dir: Path, writable: bool = False) -> None:
        self.run_dir = Path(run_dir)
        self.folder = RunDir(self.run_dir).trajectories
        self._lock = threading.Lock()
        self._shards: dict[str, list[Key]] = {}
        self._keys: set[Key] = set()
        """Every key in _shards, kept beside it so append() does not rebuild it."""
        self._lock_file = None
        self._torn_index = False
        if writable:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._lock_file = open(self.folder / ".writer.lock", "w")  # noqa: SIM115
            try:
                fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise StoreError(f"{self.run_dir} is being written by another process") from None
        elif not self.folder.is_dir():
            raise StoreError(
                f"{self.run_dir} is not a run directory (no {self.folder.name}/ folder)")
        self._load_index()
        if writable:
            self._recover()

    # ---- reading ------------------------------------------------------------------------------

    def _load_index(self) -> None:
        path = self.folder / INDEX
        if not path.exists():
            return
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines, 1):
            try:
                entry = json.loads(line)
                self._shards[entry["shard"]] = [(str(k[0]), int(k[1])) for k in entry["keys"]]
            except (ValueError, KeyError, TypeError, IndexError) as exc:
                if number == len(lines):
                    self._torn_index = True  # its shard is adopted again by _recover
                    break
                raise StoreError(f"{path} is corrupted at line {number}: {exc}") from None
        self._keys = {key for keys in self._shards.values() for key in keys}

    def keys(self) -> set[Key]:
        """(task, sample) of every stored trajectory."""
        return set(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def load(self) -> StoreContents:
        """Every trajectory; an unreadable shard is reported and skipped, never fatal."""
        found: dict[Key, Trajectory] = {}
        problems = []
        for name in sorted(self._shards):
            path = self.folder / name
            try:
                read = [from_row(row) for row in pq.read_table(path).to_pylist()]
            except (OSError, ValueError) as exc:  # pyarrow's errors derive from these
                problems.append(f"{path}: unreadable shard ({type(exc).__name__}: {exc})")
                continue
            for trajectory in read:
                found.setdefault((trajectory.task_id, trajectory.sample_index), trajectory)
        ordered = [found[k] for k in sorted(found)]
        return StoreContents(ordered, problems)

    # ---- writing ------------------------------------------------------------------------------

    def append(self, trajectories: list[Trajectory]) -> Path | None:
        """Write trajectories as one shard, durably, before returning. Keys already stored are
        skipped (a resumed run never duplicates)."""
        with self._lock:
            fresh = [t for t in trajectories if (t.task_id, t.sample_index) not in self._keys]
            if not fresh:
                return None
            name = f"shard-{len(self._shards):06d}-{uuid.uuid4().hex[:8]}.parquet"
            with atomic_file(self.folder / name) as staging:
                pq.write_table(to_table(fresh), staging)
            self._shards[name] = [(t.task_id, t.sample_index) for t in fresh]
            self._keys.update(self._shards[name])
            with open(self.folder / INDEX, "a") as index:
                index.write(_index_line(name, self._shards[name]))
                index.flush()
                os.fsync(index.fileno())
            return self.folder / name

    def _write_index(self) -> None:
        """Rewrite the whole index (recovery, compaction), atomically."""
        atomic_write_text(self.folder / INDEX,
                          "".join(_index_line(name, keys) for name, keys in self._shards.items()))

    def _recover(self) -> None:
        """Adopt complete shards the index missed; drop leftovers and dead writers' staging."""
        clean_stale_staging(self.folder)
        changed = self._torn_index  # appending after a torn line would corrupt the next one
        for path in sorted(self.folder.glob("shard-*.parquet")):
            if path.name in self._shards:
                continue
            try:
                keys = _shard_keys(path)
            except (OSError, ValueError):
                continue  # never renamed into place complete; load() reports nothing for it
            if set(keys) & self._keys:
                path.unlink()
            else:
                self._shards[path.name] = keys
                self._keys.update(keys)
            changed = True
        if changed:
            self._write_index()

    def compact(self) -> None:
        """Merge all shards into one (fewer files for readers); safe to interrupt."""
        with self._lock:
            if len(self._shards) < 2:
                return
            contents = self.load()
            if contents.problems:
                return  # never fold a damaged shard away
            old = list(self._shards)
            name = f"shard-{len(old):06d}-{uuid.uuid4().hex[:8]}.parquet"
            with atomic_file(self.folder / name) as staging:
                pq.write_table(to_table(contents.trajectories), staging)
            self._shards = {name: [(t.task_id, t.sample_index) for t in contents.trajectories]}
            self._write_index()
            for shard in old:
                (self.folder / shard).unlink(missing_ok=True)

    def close(self) -> None:
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None
