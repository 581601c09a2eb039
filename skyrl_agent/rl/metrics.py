"""A training run's per-step metrics: TensorBoard event files and a JSON-lines log.

`RUN_DIR/tensorboard/` is what people open while a run trains; `RUN_DIR/metrics.jsonl` (one line
per step) is what scripts and reports read afterwards.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skyrl_agent.data.run_dir import RunDir

if TYPE_CHECKING:  # readers of metrics.jsonl (eval) should not pay for torch
    from skyrl_agent.rl.step import StepResult


class MetricsLog:
    """Appends each step's metrics; opened by a training run, closed at its end."""

    def __init__(self, run_dir: Path, wandb_project: str | None = None,
                 settings: dict[str, Any] | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.jsonl = Path(run_dir) / "metrics.jsonl"
        self._writer: Any = SummaryWriter(log_dir=str(RunDir(run_dir).tensorboard))
        self._wandb: Any = _wandb_run(Path(run_dir), wandb_project, settings or {}) \
            if wandb_project else None

    def record(self, result: StepResult) -> None:
        values = {"reward_mean": result.reward_mean, **result.metrics}
        for name, value in values.items():
            self._writer.add_scalar(name, value, result.step)
        self._writer.flush()
        with self.jsonl.open("a") as out:
            out.write(json.dumps({"step": result.step, **values}) + "\n")
        if self._wandb is not None:
            self._wandb.log(values, step=result.step)

    def close(self) -> None:
        self._writer.close()
        if self._wandb is not None:
            self._wandb.finish()


def _wandb_run(run_dir: Path, project: str, settings: dict[str, Any]) -> Any:
    """A W&B run named after the run dir; a resumed training run continues the same one."""
    import wandb

    run_id = re.sub(r"[^A-Za-z0-9_-]", "-", run_dir.resolve().name)[:64]
    return wandb.init(project=project, dir=str(run_dir), id=run_id, name=run_dir.name,
                      config=settings, resume="allow",
                      settings=wandb.Settings(console="off", silent=True))


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
