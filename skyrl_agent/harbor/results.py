"""Harbor's verdict on a rollout (its rewards and its error) in our terms: a Reward, and
whether Harbor's error policy lets the sample be trained on. Shared by the in-process trial
(trial.py) and relayed jobs (relay_job.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from skyrl_agent.collector.policy import ERROR_TYPES, FINISH_ERROR_TYPES, policy_for
from skyrl_agent.types import FailureKind, FinishReason, Reward


def harbor_reward(rewards: Mapping[str, float | int | None] | None, why_none: str,
                  error: HarborError | None = None) -> Reward:
    """The rewards Harbor's verifier wrote: `reward` when it is there, else their mean; 0
    (`why_none`) after an error of ours that forfeits the sample (OWN_EXCEPTIONS)."""
    if error is not None and error.failure in OWN_EXCEPTIONS.values():
        return Reward.failed(why_none)
    numbers = {key: float(value) for key, value in (rewards or {}).items() if value is not None}
    if not numbers:
        return Reward.failed(why_none)
    return Reward(numbers.get("reward", sum(numbers.values()) / len(numbers)), numbers)


OWN_EXCEPTIONS: Mapping[str, FailureKind] = MappingProxyType({
    "SandboxDied": FailureKind.SANDBOX_DIED,
    "ArtifactLimitExceeded": FailureKind.OVER_LIMIT,
})
"""Our sandboxes' exceptions, by the class name Harbor records when one ends a trial (e.g. a
sandbox ended for passing its relay route's limits): the sample's own failure, so reward 0,
kept and never retried, as in our own episodes (collector/policy.py). Harbor's table does not
know them (it would retry them, and we would count them as the host's)."""
OWN_ERROR_POLICY = {name: {"should_retry": False, "should_grade": False,
                           "has_valid_reward": True} for name in OWN_EXCEPTIONS}
"""The same, as a job's `override_error_policy` entries: Harbor neither retries nor grades."""


@dataclass(frozen=True)
class HarborError:
    """A Harbor error type, decided by Harbor's policy table."""

    failure: FailureKind | None
    finish_reason: FinishReason
    masked: bool


def harbor_error(error_type: str | None) -> HarborError:
    """Our failure kind for a Harbor error type (ours where the mapping has it, else the
    host's for what Harbor retries and the agent's for the rest), and its masking."""
    if error_type is None:
        return HarborError(None, FinishReason.STOP, False)
    own = OWN_EXCEPTIONS.get(error_type)
    if own is not None:
        return HarborError(own, FinishReason.SANDBOX_ERROR, False)
    finish = {name: reason for reason, name in FINISH_ERROR_TYPES.items()}.get(error_type)
    masked = not policy_for(error_type).has_valid_reward
    if finish is not None:
        return HarborError(None, finish, masked)
    failure = next((kind for kind, name in ERROR_TYPES.items() if name == error_type), None)
    if failure is None:
        failure = FailureKind.INFRA if policy_for(error_type).should_retry \
            else FailureKind.AGENT_CRASH
    reason = FinishReason.AGENT_TIMEOUT if failure == FailureKind.AGENT_TIMEOUT \
        else FinishReason.ERROR
    return HarborError(failure, reason, masked)


def _seconds(phase: Any) -> float:
    if phase is None or phase.started_at is None or phase.finished_at is None:
        return 0.0
    return max(0.0, (phase.finished_at - phase.started_at).total_seconds())


def harbor_times(result: Any) -> dict[str, float]:
    """A Harbor trial's phase timings (a harbor TrialResult; None: unknown) as our time
    account's Trajectory fields: its environment setup is the sandbox's start, its agent
    setup and run the agent's time, its verifier the verification."""
    if result is None:
        return {}
    return {"sandbox_time_s": _seconds(result.environment_setup),
            "agent_time_s": _seconds(result.agent_setup) + _seconds(result.agent_execution),
            "verify_time_s": _seconds(result.verifier), "total_time_s": _seconds(result)}
