"""What a failed rollout means for training (SkyRL-like defaults, configurable).

- context overflow: the attempt counts, with reward 0 (the agent used its budget badly);
- agent timeout, agent crash: masked (no gradient), kept with the reason;
- a failure the host can pin on infrastructure (FailureKind.INFRA: sandbox start, engine,
  model server): retried up to `infra_retries` times, then masked;
- a sandbox that died under the agent, or artifacts over their limits: reward 0, kept (an agent
  must not be able to opt out of a negative reward by breaking its sandbox);
- with `mask_group_on_failure`, one masked sample masks its whole group.
"""

from __future__ import annotations

import dataclasses

from skyrl_agent.config import CollectorConfig
from skyrl_agent.types import FailureKind, FinishReason, Reward, Trajectory, TrajectoryGroup

MASKED_FAILURES = frozenset({FailureKind.INFRA, FailureKind.UNSUPPORTED,
                             FailureKind.AGENT_TIMEOUT, FailureKind.AGENT_CRASH})
"""Failures that carry no gradient; the others (sandbox_died, over_limit) score 0 and are kept."""


def is_infra_failure(trajectory: Trajectory) -> bool:
    return trajectory.failure == FailureKind.INFRA


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
