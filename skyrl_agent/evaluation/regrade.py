"""Re-grading: run a task's tests again, in a fresh sandbox, on a stored final state."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from skyrl_agent.collector import final_state
from skyrl_agent.config import SandboxConfig
from skyrl_agent.envs.env import Env
from skyrl_agent.errors import UserError
from skyrl_agent.sandboxes.base import (
    SandboxError,
    SandboxSpec,
    UnsupportedEnvironment,
    create_sandbox,
)
from skyrl_agent.tasks import find_task
from skyrl_agent.types import Trajectory


@dataclass(frozen=True)
class Regrade:
    task_id: str
    sample_index: int
    stored: float
    regraded: float | None
    """None when it could not be re-graded (see note)."""
    note: str = ""


async def _one(trajectory: Trajectory, run_dir: Path, config: SandboxConfig) -> Regrade:
    archive = final_state.state_path(run_dir, trajectory.task_id, trajectory.sample_index)
    stored = trajectory.reward.value
    if not archive.is_file():
        return Regrade(trajectory.task_id, trajectory.sample_index, stored, None,
                       "no stored final state")
    try:
        task = find_task(trajectory.task_id)
    except UserError as exc:
        return Regrade(trajectory.task_id, trajectory.sample_index, stored, None, str(exc))
    try:
        async with create_sandbox(SandboxSpec.from_task(task, config), config) as sandbox:
            env = Env(task, sandbox)
            await final_state.restore(env, archive)
            reward = await env.verify()
    except (SandboxError, UnsupportedEnvironment) as exc:
        return Regrade(trajectory.task_id, trajectory.sample_index, stored, None,
                       f"sandbox: {exc}")
    return Regrade(trajectory.task_id, trajectory.sample_index, stored, reward.value,
                   reward.reason or "")


async def regrade(trajectories: list[Trajectory], run_dir: Path, config: SandboxConfig,
                  jobs: int = 2) -> list[Regrade]:
    limit = asyncio.Semaphore(jobs)

    async def bounded(t: Trajectory) -> Regrade:
        async with limit:
            return await _one(t, run_dir, config)

    return list(await asyncio.gather(*[bounded(t) for t in trajectories]))
