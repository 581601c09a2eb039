"""A training run's checkpoints: the backend's state plus where the loop stood.

`RUN_DIR/checkpoints/step-NNNNNN/` holds the backend's files (weights, optimizer, RNG, step) and
`loop.json` (which groups of the task stream were trained or dropped, and the next position).
`loop.json` is written last and atomically: a folder without it is an interrupted save, and the
newest complete one is what a resumed run loads. The store holds every sampled trajectory; with
the loop state a resumed run knows which of them the restored weights have seen.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from skyrl_agent.atomic import atomic_write_text, clean_stale_staging
from skyrl_agent.backends.backend import TrainerBackend
from skyrl_agent.data.run_dir import RunDir

LOOP_FILE = "loop.json"


@dataclass
class LoopState:
    """Where a training loop stands in its task stream (mutable: the loop updates it)."""

    step: int = 0
    """Optimizer steps taken (= the policy version the servers hold)."""
    next_position: int = 0
    """The first stream position never admitted."""
    trained: list[int] = field(default_factory=list)
    """Positions whose groups the weights have been trained on."""
    dropped: list[int] = field(default_factory=list)
    """Positions dropped for staleness (stored, never trained)."""
    twins: list[int] = field(default_factory=list)
    """Positions that sampled an impossible twin (stored and counted, never trained)."""

    def pending(self) -> list[int]:
        """Positions admitted but neither trained, dropped nor counted as twins (in flight at
        the save)."""
        done = set(self.trained) | set(self.dropped) | set(self.twins)
        return [p for p in range(self.next_position) if p not in done]


class Checkpoints:
    """Save, find and load a run's checkpoints, keeping the newest `keep`."""

    def __init__(self, run_dir: Path, keep: int = 2) -> None:
        self.folder = RunDir(run_dir).checkpoints
        self.keep = keep

    def save(self, backend: TrainerBackend, state: LoopState) -> Path:
        path = self.folder / f"step-{state.step:06d}"
        clean_stale_staging(self.folder)  # a killed save's staging, of any step
        backend.save_state(path, data_position=state.next_position)
        atomic_write_text(path / LOOP_FILE, json.dumps(asdict(state)))
        for old in self.complete()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return path

    def complete(self) -> list[Path]:
        """Complete checkpoints, oldest first."""
        if not self.folder.is_dir():
            return []
        return sorted(p for p in self.folder.glob("step-*") if (p / LOOP_FILE).is_file())

    def latest(self) -> Path | None:
        found = self.complete()
        return found[-1] if found else None

    def load(self, backend: TrainerBackend, path: Path) -> LoopState:
        backend.load_state(path)
        return LoopState(**json.loads((path / LOOP_FILE).read_text()))
