"""Harbor's verdict on a rollout (its rewards and its error) in our terms: a Reward, and
whether Harbor's error policy lets the sample be trained on. Shared by the in-process trial
(trial.py) and relayed jobs (relay_job.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from skyrl_agent.collector.policy import ERROR_TYPES, FINISH_ERROR_TYPES, policy_for
from skyrl_agent.types import FailureKind, FinishReason, Reward


def harbor_reward(rewards: Mapping[str, float | int | None] | None, why_none: str) -> Reward:
    """The rewards Harbor's verifier wrote: `reward` when it is there, else their mean."""
    numbers = {key: float(value) for key, value in (rewards or {}).items() if value is not None}
    if not numbers:
        return Reward.failed(why_none)
    return Reward(numbers.get("reward", sum(numbers.values()) / len(numbers)), numbers)


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
