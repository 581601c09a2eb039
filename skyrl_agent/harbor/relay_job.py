"""A Harbor job run through the relay, as our trajectories.

`harbor serve` runs the job (its agents, environments and verifier); the relay brought every
model call of each rollout to the capture proxy, where it was recorded in that rollout's own
session (relay.py, CaptureProxy.open_rollouts). Once the job is done, each rollout Harbor
lists becomes one trajectory: the recorded segments, Harbor's rewards, and Harbor's error
decided by its policy table (masked when its reward is not valid). Samples of one task are
numbered in the order Harbor created them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from skyrl_agent.capture import RolloutSessions
from skyrl_agent.harbor.results import harbor_error, harbor_reward, harbor_times
from skyrl_agent.types import Trajectory

FINISHED = ("finished", "cancelled")
"""Job states after which no rollout runs."""


async def wait_for_job(api: Any, job_id: Any, timeout_s: float, poll_s: float = 1.0) -> Any:
    """The job once Harbor says it is over (`api`: harbor.client.AsyncHarbor)."""
    deadline = time.monotonic() + timeout_s
    while True:
        job = await api.jobs.get(job_id)
        if job.state in FINISHED:
            return job
        if time.monotonic() > deadline:
            raise TimeoutError(f"harbor job {job_id} still {job.state} after {timeout_s:.0f} s")
        await asyncio.sleep(poll_s)


def task_id_of(rollout: Any, task_ids: Mapping[Path, str]) -> str:
    """Our name of a rollout's task: by the folder Harbor's lock records (Harbor names a
    local task by its folder), else Harbor's name."""
    path = getattr(rollout.lock.task, "path", None)
    return task_ids.get(Path(path).resolve(), rollout.task.name) if path else rollout.task.name


def job_trajectories(rollouts: Sequence[Any], sessions: RolloutSessions, agent: str,
                     task_ids: Mapping[Path, str]) -> list[Trajectory]:
    """Each rollout (a harbor.server.models.RolloutDetail) as a trajectory; `task_ids` names
    the submitted task folders (resolved) by our task ids."""
    named = [(task_id_of(r, task_ids), r) for r in rollouts]
    ordered = sorted(named, key=lambda pair: (pair[0], pair[1].created_at, str(pair[1].id)))
    counts: dict[str, int] = {}
    trajectories = []
    for task_id, rollout in ordered:
        index = counts[task_id] = counts.get(task_id, -1) + 1
        captured = sessions.sessions.get(str(rollout.id))
        decided = harbor_error(rollout.error_type)
        why = rollout.error_type or "the rollout has no reward"
        trajectories.append(Trajectory(
            task_id=task_id, sample_index=index, agent=f"harbor:{agent}",
            segments=captured.llm.segments if captured is not None else (),
            reward=harbor_reward(rollout.rewards, why, decided),
            finish_reason=decided.finish_reason, failure=decided.failure, masked=decided.masked,
            mask_reason=why if decided.masked else None, **harbor_times(rollout.result),
            model_time_s=captured.llm.model_time_s if captured is not None else 0.0,
            metrics={**({**captured.llm.metrics(), **captured.metrics()}
                        if captured is not None else {}),
                     "harbor_rollout": 1.0}))
    return trajectories
