"""RunDir: the one owner of a run directory's layout.

```
RUN_DIR/
  config.json          what was sampled: the settings and n (checked again on resume)
  trajectories/        the TrajectoryStore's Parquet shards and index
  final_state/         one artifact bundle per sample (what `eval --regrade` verifies again)
  run.log              the run's log (every command that writes a run dir appends to it)
  server.log           the embedded model server's output, when the run started one
  checkpoints/         a training run's checkpoints, step-NNNNNN/ (weights, optimizer, loop)
  tensorboard/         a training run's metrics as TensorBoard event files
```
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skyrl_agent.atomic import atomic_write_text
from skyrl_agent.errors import UserError


def sample_stem(task_id: str, sample_index: int) -> str:
    """A file name for one sample: `demo/hello-file`, 3 -> `demo__hello-file#3`."""
    return f"{task_id.replace('/', '__')}#{sample_index}"


@dataclass(frozen=True)
class RunRecord:
    """What config.json holds: the settings a run sampled with (collector bounds excluded:
    concurrency may change between a run and its resumption, what is sampled may not)."""

    n: int
    """Samples per task."""
    config: dict[str, Any]
    """The RunConfig as JSON, without its `collector` section."""

    def section(self, *keys: str) -> Any:
        """A nested value, e.g. section("tasks", "source"); None when absent."""
        value: Any = self.config
        for key in keys:
            if not isinstance(value, dict):
                return None
            value = value.get(key)
        return value


@dataclass(frozen=True)
class RunDir:
    """Paths inside one run directory, and its config.json."""

    path: Path

    @property
    def config_file(self) -> Path:
        return self.path / "config.json"

    @property
    def trajectories(self) -> Path:
        return self.path / "trajectories"

    @property
    def run_log(self) -> Path:
        return self.path / "run.log"

    @property
    def server_log(self) -> Path:
        return self.path / "server.log"

    def server_log_of(self, index: int, count: int) -> Path:
        """The log of embedded server `index` of `count` (server.log when there is one)."""
        return self.server_log if count == 1 else self.path / f"server-{index}.log"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def tensorboard(self) -> Path:
        return self.path / "tensorboard"

    def state_path(self, task_id: str, sample_index: int) -> Path:
        """Where one sample's final state (its artifact bundle) is kept."""
        return self.path / "final_state" / f"{sample_stem(task_id, sample_index)}.tar.gz"

    def record(self) -> RunRecord | None:
        """The run's config.json, or None when it is missing or unreadable."""
        try:
            data = json.loads(self.config_file.read_text())
            return RunRecord(n=int(data["n"]), config=dict(data["config"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def prepare(self, record: RunRecord) -> None:
        """Create the run dir, or check that an existing one sampled with the same settings."""
        wanted = {"n": record.n, "config": record.config}
        if self.config_file.exists():
            try:
                before = json.loads(self.config_file.read_text())
            except ValueError:
                raise UserError(f"{self.config_file} is corrupted; choose another --output") \
                    from None
            if before != wanted:
                raise UserError(f"{self.path} holds a run with other settings; resume it with "
                                "the same command or choose another --output")
            return
        self.path.mkdir(parents=True, exist_ok=True)
        self.rewrite(record)

    def rewrite(self, record: RunRecord) -> None:
        """Write config.json atomically (also how a resumed run records what it changed)."""
        atomic_write_text(self.config_file,
                          json.dumps({"n": record.n, "config": record.config}, indent=2))
