"""Re-grading: a stored final state (the artifact bundle) through the same separate-mode
verification an episode uses: a fresh sandbox, the bundle restored, the tests run."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from skyrl_agent.config import SandboxConfig
from skyrl_agent.data.run_dir import RunDir
from skyrl_agent.envs.episode import fresh_sandboxes, grade
from skyrl_agent.errors import UserError
from skyrl_agent.sandboxes.base import SandboxError, UnsupportedEnvironment
from skyrl_agent.tasks import find_task
from skyrl_agent.tasks.spec import TaskSpec
from skyrl_agent.types import Trajectory


@dataclass(frozen=True)
class Regrade:
    task_id: str
    sample_index: int
    stored: float
    regraded: float | None
    """None when it could not be re-graded (see note)."""
    note: str = ""


async def _one(trajectory: Trajectory, run_dir: Path, config: SandboxConfig,
               tasks: Mapping[str, TaskSpec]) -> Regrade:
    archive = RunDir(run_dir).state_path(trajectory.task_id, trajectory.sample_index)
    stored = trajectory.reward.value
    if not archive.is_file():
        return Regrade(trajectory.task_id, trajectory.sample_index, stored, None,
                       "no stored final state")
    try:
        task = tasks.get(trajectory.task_id) or find_task(trajectory.task_id)
    except UserError as exc:
        return Regrade(trajectory.task_id, trajectory.sample_index, stored, None, str(exc))
    try:
        reward = await grade(task, archive.read_bytes(), fresh_sandboxes(config))
    except (SandboxError, UnsupportedEnvironment) as exc:
        return Regrade(trajectory.task_id, trajectory.sample_index, stored, None,
                       f"sandbox: {exc}")
    return Regrade(trajectory.task_id, trajectory.sample_index, stored, reward.value,
                   reward.reason or "")


async def regrade(trajectories: list[Trajectory], run_dir: Path, config: SandboxConfig,
                  jobs: int = 2, tasks: Mapping[str, TaskSpec] | None = None) -> list[Regrade]:
    """Re-grade each trajectory's stored state; `tasks` (by name) are the run's own, when the
    run's task source can still be loaded, else tasks are looked up by name."""
    limit = asyncio.Semaphore(jobs)

    async def bounded(t: Trajectory) -> Regrade:
        async with limit:
            return await _one(t, run_dir, config, tasks or {})

    return list(await asyncio.gather(*[bounded(t) for t in trajectories]))
