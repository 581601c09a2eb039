"""The failure policy: what is retried, scored 0, kept or masked (pure, fast)."""

from __future__ import annotations

import pytest

from skyrl_agent.collector.policy import MASKED_FAILURES, FailurePolicy
from skyrl_agent.config import CollectorConfig
from skyrl_agent.types import FailureKind, FinishReason, Reward, Trajectory


def sample(index: int = 0, failure: FailureKind | None = None, reward: float = 1.0,
           finish: FinishReason = FinishReason.STOP) -> Trajectory:
    masked = failure in MASKED_FAILURES
    return Trajectory(task_id="demo/t", sample_index=index, agent="a", segments=(),
                      reward=Reward(reward, {"reward": reward}, verify_time_s=2.0),
                      finish_reason=finish, masked=masked,
                      mask_reason="why" if masked else None, failure=failure,
                      metrics={"turns": 3})


@pytest.mark.parametrize("failure, retried", [
    (FailureKind.INFRA, True), (None, False), (FailureKind.UNSUPPORTED, False),
    (FailureKind.AGENT_TIMEOUT, False), (FailureKind.AGENT_CRASH, False),
    (FailureKind.SANDBOX_DIED, False), (FailureKind.OVER_LIMIT, False)])
def test_only_infrastructure_failures_are_retried_and_only_up_to_the_limit(failure, retried):
    policy = FailurePolicy(CollectorConfig(infra_retries=2))
    assert policy.should_retry(sample(failure=failure), 0) is retried
    assert policy.should_retry(sample(failure=failure), 1) is retried
    assert policy.should_retry(sample(failure=failure), 2) is False
    assert FailurePolicy(CollectorConfig(infra_retries=0)).should_retry(
        sample(failure=failure), 0) is False


def test_the_agents_own_failures_are_kept_with_reward_and_never_masked():
    # An agent must not opt out of a negative reward by breaking its sandbox.
    assert FailureKind.SANDBOX_DIED not in MASKED_FAILURES
    assert FailureKind.OVER_LIMIT not in MASKED_FAILURES
    assert {FailureKind.INFRA, FailureKind.AGENT_TIMEOUT} <= MASKED_FAILURES


def test_finalize_scores_an_overflow_zero_and_counts_retries():
    policy = FailurePolicy(CollectorConfig())
    kept = policy.finalize(sample(reward=1.0), 2)
    assert kept.reward.value == 1.0 and kept.metrics == {"turns": 3, "infra_retries": 2}
    overflow = policy.finalize(sample(reward=1.0, finish=FinishReason.CONTEXT_OVERFLOW), 0)
    assert overflow.reward.value == 0.0 and overflow.reward.reason == "context overflow"
    assert overflow.reward.verify_time_s == 2.0 and not overflow.masked
    masked = sample(failure=FailureKind.AGENT_TIMEOUT, finish=FinishReason.CONTEXT_OVERFLOW)
    assert policy.finalize(masked, 0).reward == masked.reward  # masked: no reward rewrite


def test_a_group_is_ordered_and_masked_whole_only_when_asked():
    members = [sample(2), sample(0, failure=FailureKind.AGENT_CRASH), sample(1)]
    group = FailurePolicy(CollectorConfig()).group("demo/t", members)
    assert [t.sample_index for t in group.trajectories] == [0, 1, 2]
    assert [t.masked for t in group.trajectories] == [True, False, False]
    whole = FailurePolicy(CollectorConfig(mask_group_on_failure=True)).group("demo/t", members)
    assert all(t.masked for t in whole.trajectories)
    assert whole.trajectories[0].mask_reason == "why"  # its own reason stays
    assert whole.trajectories[1].mask_reason == "group member 0 masked: why"
    clean = FailurePolicy(CollectorConfig(mask_group_on_failure=True)).group(
        "demo/t", [sample(0), sample(1)])
    assert not any(t.masked for t in clean.trajectories)
