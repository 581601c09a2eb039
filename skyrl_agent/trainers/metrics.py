"""A training run's per-step metrics: TensorBoard event files and a JSON-lines log.

`RUN_DIR/tensorboard/` is what people open while a run trains; `RUN_DIR/metrics.jsonl` (one line
per step) is what scripts and reports read afterwards.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skyrl_agent.data.run_dir import RunDir

if TYPE_CHECKING:  # readers of metrics.jsonl (eval) should not pay for torch
    from skyrl_agent.trainers.reference_loop import StepResult


class MetricsLog:
    """Appends each step's metrics; opened by a training run, closed at its end."""

    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.jsonl = Path(run_dir) / "metrics.jsonl"
        self._writer: Any = SummaryWriter(log_dir=str(RunDir(run_dir).tensorboard))

    def record(self, result: StepResult) -> None:
        values = {"reward_mean": result.reward_mean, **result.metrics}
        for name, value in values.items():
            self._writer.add_scalar(name, value, result.step)
        self._writer.flush()
        with self.jsonl.open("a") as out:
            out.write(json.dumps({"step": result.step, **values}) + "\n")

    def close(self) -> None:
        self._writer.close()


def read_metrics(run_dir: Path) -> list[dict[str, float]]:
    """Every step's metrics, in order (a torn last line, from a crash, is skipped)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows
