"""What a failed rollout means for training: Harbor's error policy, so that a task run through
`harbor run` and through `skyrl-agent rollout` gets the same decisions.

Each failure is named by the Harbor error type it corresponds to (`ERROR_TYPES`), and Harbor's
table (`harbor.models.trial.error_policy`) says, per type, whether to retry the sample, whether
its reward is graded, and whether that reward is valid for training. Overrides use Harbor's own
format (`collector.override_error_policy`). With the defaults:

- a sandbox that would not start, a model server error (INFRA): retried up to `infra_retries`
  times with a fresh sandbox, then masked;
- an environment the backend cannot give (UNSUPPORTED): masked, never retried;
- agent timeout, agent crash, context overflow, token budget spent: graded and kept (Harbor's
  AgentTimeoutError, NonZeroAgentExitCodeError, ContextLengthExceededError,
  OutputTokenExceededError): the verifier's reward stands, so stalling cannot dodge a 0;
- a sandbox that died under the agent, artifacts over their limits: reward 0, kept. Harbor has
  no type for these; ours are never retried, since an agent must not be able to opt out of a
  negative reward by breaking its sandbox;
- the trainer drops a group with a masked sample and counts it (rl/batch.py), rather
  than computing an advantage without the failed sample; `mask_group_on_failure` also marks
  the whole group masked in the store.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType

from harbor.models.trial.error_policy import ERROR_POLICIES, ErrorPolicy, ErrorPolicyOverride
from harbor.models.trial.error_policy import policy_for as harbor_policy_for

from skyrl_agent.config import CollectorConfig
from skyrl_agent.errors import UserError
from skyrl_agent.types import FailureKind, FinishReason, Reward, Trajectory, TrajectoryGroup

ERROR_TYPES: Mapping[FailureKind, str] = MappingProxyType({
    FailureKind.INFRA: "EnvironmentStartTimeoutError",
    FailureKind.UNSUPPORTED: "ServiceOperationsUnsupportedError",
    FailureKind.AGENT_TIMEOUT: "AgentTimeoutError",
    FailureKind.AGENT_CRASH: "NonZeroAgentExitCodeError",
    FailureKind.SANDBOX_DIED: "SandboxDiedError",
    FailureKind.OVER_LIMIT: "ArtifactLimitExceededError",
})
"""The Harbor error type each failure is decided as."""
FINISH_ERROR_TYPES: Mapping[FinishReason, str] = MappingProxyType({
    FinishReason.CONTEXT_OVERFLOW: "ContextLengthExceededError",
    FinishReason.TOKEN_BUDGET: "OutputTokenExceededError",
})
"""Endings that are not failures of ours but are Harbor errors."""
OWN_POLICIES: Mapping[str, ErrorPolicy] = MappingProxyType({
    "SandboxDiedError": ErrorPolicy(should_retry=False, should_grade=False,
                                    has_valid_reward=True),
    "ArtifactLimitExceededError": ErrorPolicy(should_retry=False, should_grade=False,
                                              has_valid_reward=True),
})
"""Our failures Harbor has no type for."""


def policy_for(error_type: str, override: ErrorPolicyOverride | None = None) -> ErrorPolicy:
    """Harbor's policy for an error type (ours for the types it lacks), with `override`."""
    policy = OWN_POLICIES.get(error_type) or harbor_policy_for(error_type)
    return override.apply(policy) if override is not None else policy


MASKED_FAILURES = frozenset(kind for kind, name in ERROR_TYPES.items()
                            if not policy_for(name).has_valid_reward)
"""Failures that carry no gradient under the default policy."""


def error_type(trajectory: Trajectory) -> str | None:
    """The Harbor error type a trajectory ended in; None when it ended without one."""
    if trajectory.failure is not None:
        return ERROR_TYPES[trajectory.failure]
    return FINISH_ERROR_TYPES.get(trajectory.finish_reason)


class FailurePolicy:
    def __init__(self, config: CollectorConfig) -> None:
        self.config = config
        known = {*ERROR_POLICIES, *OWN_POLICIES, *FINISH_ERROR_TYPES.values()}
        unknown = sorted(set(config.override_error_policy) - known)
        if unknown:
            raise UserError(f"collector.override_error_policy: unknown error type "
                            f"{unknown[0]!r}; ours are {', '.join(ERROR_TYPES.values())}, and "
                            f"Harbor's names are taken too (e.g. AgentTimeoutError)")
        self.overrides = {name: ErrorPolicyOverride(**given.model_dump(exclude_none=True))
                          for name, given in config.override_error_policy.items()}

    def decision(self, trajectory: Trajectory) -> ErrorPolicy | None:
        """Retry / grade / reward-valid for the trajectory's error; None when it had none."""
        name = error_type(trajectory)
        return None if name is None else self._decided(name)

    def _decided(self, name: str) -> ErrorPolicy:
        return policy_for(name, self.overrides.get(name))

    def should_retry(self, trajectory: Trajectory, retries_done: int) -> bool:
        decision = self.decision(trajectory)
        return (decision is not None and decision.should_retry
                and retries_done < self.config.infra_retries)

    def finalize(self, trajectory: Trajectory, retries_done: int) -> Trajectory:
        """The trajectory as stored: graded or scored 0, masked or kept, retries counted."""
        metrics = {**trajectory.metrics, "infra_retries": retries_done}
        changes: dict = {"metrics": metrics}
        name = error_type(trajectory)
        if name is not None:
            decision, reward = self._decided(name), trajectory.reward
            if not decision.should_grade and reward.value != 0.0:
                changes["reward"] = Reward.failed(f"not graded after {name}",
                                                  reward.verify_time_s)
            masked = not decision.has_valid_reward
            changes["masked"] = masked
            changes["mask_reason"] = (trajectory.mask_reason or reward.reason
                                      or f"{name}: the reward is not valid") if masked else None
        return dataclasses.replace(trajectory, **changes)

    def group(self, task_id: str, trajectories: list[Trajectory]) -> TrajectoryGroup:
        ordered = tuple(sorted(trajectories, key=lambda t: t.sample_index))
        masked = [t for t in ordered if t.masked]
        if self.config.mask_group_on_failure and masked:
            why = f"group member {masked[0].sample_index} masked: {masked[0].mask_reason}"
            ordered = tuple(t if t.masked else dataclasses.replace(t, masked=True, mask_reason=why)
                            for t in ordered)
        return TrajectoryGroup(task_id, ordered)
