"""What a failed rollout means for training (SkyRL-like defaults, configurable).

- context overflow: the attempt counts, with reward 0 (the agent used its budget badly);
- agent timeout, agent crash: masked (no gradient), kept with the reason;
- sandbox or model-server (infrastructure) error: retried up to `infra_retries` times, then
  masked;
- with `mask_group_on_failure`, one masked sample masks its whole group.
"""

from __future__ import annotations

import dataclasses

from skyrl_agent.config import CollectorConfig
from skyrl_agent.types import FinishReason, Reward, Trajectory, TrajectoryGroup

INFRA_PREFIXES = ("sandbox error", "model server")


def is_infra_failure(trajectory: Trajectory) -> bool:
    return trajectory.masked and (trajectory.mask_reason or "").startswith(INFRA_PREFIXES)


class FailurePolicy:
    def __init__(self, config: CollectorConfig) -> None:
        self.config = config

    def should_retry(self, trajectory: Trajectory, retries_done: int) -> bool:
        return is_infra_failure(trajectory) and retries_done < self.config.infra_retries

    def finalize(self, trajectory: Trajectory, retries_done: int) -> Trajectory:
        """The trajectory as stored: overflow scored 0, retries counted."""
        metrics = {**trajectory.metrics, "infra_retries": retries_done}
        changes: dict = {"metrics": metrics}
        if trajectory.finish_reason == FinishReason.CONTEXT_OVERFLOW and not trajectory.masked:
            changes["reward"] = Reward.failed("context overflow",
                                              trajectory.reward.verify_time_s)
        return dataclasses.replace(trajectory, **changes)

    def group(self, task_id: str, trajectories: list[Trajectory]) -> TrajectoryGroup:
        ordered = tuple(sorted(trajectories, key=lambda t: t.sample_index))
        masked = [t for t in ordered if t.masked]
        if self.config.mask_group_on_failure and masked:
            why = f"group member {masked[0].sample_index} masked: {masked[0].mask_reason}"
            ordered = tuple(t if t.masked else dataclasses.replace(t, masked=True, mask_reason=why)
                            for t in ordered)
        return TrajectoryGroup(task_id, ordered)
