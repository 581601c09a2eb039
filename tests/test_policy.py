"""The failure policy: what is retried, scored 0, kept or masked (pure, fast)."""

from __future__ import annotations

import pytest

from skyrl_agent.collector.policy import MASKED_FAILURES, FailurePolicy, error_type, policy_for
from skyrl_agent.config import CollectorConfig
from skyrl_agent.rl.step import group_metrics
from skyrl_agent.types import FailureKind, FinishReason, Reward, Trajectory


def sample(index: int = 0, failure: FailureKind | None = None, reward: float = 1.0,
           finish: FinishReason = FinishReason.STOP) -> Trajectory:
    masked = failure in MASKED_FAILURES
    return Trajectory(task_id="demo/t", sample_index=index, agent="a", segments=(),
                      reward=Reward(reward, {"reward": reward}, verify_time_s=2.0),
                      finish_reason=finish, masked=masked,
                      mask_reason="why" if masked else None, failure=failure,
                      metrics={"turns": 3})


DECISIONS = [  # (retry, grade, reward valid): Harbor's table, and ours where it has no type
    (FailureKind.INFRA, FinishReason.SANDBOX_ERROR, (True, False, False)),
    (FailureKind.UNSUPPORTED, FinishReason.SANDBOX_ERROR, (False, False, False)),
    (FailureKind.AGENT_TIMEOUT, FinishReason.AGENT_TIMEOUT, (False, True, True)),
    (FailureKind.AGENT_CRASH, FinishReason.ERROR, (False, True, True)),
    (FailureKind.SANDBOX_DIED, FinishReason.SANDBOX_ERROR, (False, False, True)),
    (FailureKind.OVER_LIMIT, FinishReason.STOP, (False, False, True)),
    (None, FinishReason.CONTEXT_OVERFLOW, (False, True, True)),
    (None, FinishReason.TOKEN_BUDGET, (False, True, True)),
]


@pytest.mark.parametrize("failure, finish, expected", DECISIONS)
def test_every_failure_is_decided_as_harbor_decides_its_error_type(failure, finish, expected):
    from harbor.models.trial.error_policy import ERROR_POLICIES

    trajectory = sample(failure=failure, finish=finish)
    decision = FailurePolicy(CollectorConfig()).decision(trajectory)
    assert decision is not None
    assert (decision.should_retry, decision.should_grade, decision.has_valid_reward) == expected
    name = error_type(trajectory)
    if name in ERROR_POLICIES:  # the same row as `harbor run` reads
        assert decision == ERROR_POLICIES[name]
    else:  # ours: never retried, never a way out of a 0 (an agent can break its sandbox)
        assert failure in (FailureKind.SANDBOX_DIED, FailureKind.OVER_LIMIT)
    assert (failure in MASKED_FAILURES) is (not expected[2] and failure is not None)
    assert FailurePolicy(CollectorConfig()).decision(sample()) is None  # a clean ending


@pytest.mark.parametrize("failure, finish, expected", DECISIONS)
def test_only_what_the_policy_retries_is_retried_and_only_up_to_the_limit(failure, finish,
                                                                          expected):
    retried = expected[0]
    trajectory = sample(failure=failure, finish=finish)
    policy = FailurePolicy(CollectorConfig(infra_retries=2))
    assert policy.should_retry(trajectory, 0) is retried
    assert policy.should_retry(trajectory, 1) is retried
    assert policy.should_retry(trajectory, 2) is False
    assert FailurePolicy(CollectorConfig(infra_retries=0)).should_retry(trajectory, 0) is False
    assert policy.should_retry(sample(), 0) is False


def test_the_agents_own_failures_are_kept_with_their_reward():
    policy = FailurePolicy(CollectorConfig())
    # Graded: a timeout or crash keeps what the verifier said, so stalling cannot dodge a 0.
    for failure, finish in [(FailureKind.AGENT_TIMEOUT, FinishReason.AGENT_TIMEOUT),
                            (FailureKind.AGENT_CRASH, FinishReason.ERROR)]:
        kept = policy.finalize(sample(failure=failure, finish=finish, reward=1.0), 1)
        assert not kept.masked and kept.mask_reason is None and kept.reward.value == 1.0
        assert kept.metrics == {"turns": 3, "infra_retries": 1}
    # Not graded but valid: a dead sandbox scores 0 and is trained on.
    died = policy.finalize(sample(failure=FailureKind.SANDBOX_DIED, reward=1.0), 0)
    assert not died.masked and died.reward.value == 0.0
    assert died.reward.reason == "not graded after SandboxDiedError"
    assert died.reward.verify_time_s == 2.0
    infra = policy.finalize(sample(failure=FailureKind.INFRA, reward=0.0), 2)
    assert infra.masked and infra.mask_reason == "why"
    overflow = policy.finalize(sample(reward=1.0, finish=FinishReason.CONTEXT_OVERFLOW), 0)
    assert overflow.reward.value == 1.0 and not overflow.masked


def test_harbors_override_format_changes_the_decision():
    from harbor.models.trial.error_policy import ErrorPolicyOverride

    from skyrl_agent.config import load_config
    from skyrl_agent.errors import UserError

    overrides = ("{AgentTimeoutError: {has_valid_reward: false}, "
                 "EnvironmentStartTimeoutError: {should_retry: false}, "
                 "ContextLengthExceededError: {should_grade: false}}")
    config = load_config(None, [f"collector.override_error_policy={overrides}"]).collector
    policy = FailurePolicy(config)
    timeout = policy.finalize(sample(failure=FailureKind.AGENT_TIMEOUT,
                                     finish=FinishReason.AGENT_TIMEOUT, reward=1.0), 0)
    assert timeout.masked and timeout.mask_reason == "AgentTimeoutError: the reward is not valid"
    assert not policy.should_retry(sample(failure=FailureKind.INFRA), 0)
    overflow = policy.finalize(sample(reward=1.0, finish=FinishReason.CONTEXT_OVERFLOW), 0)
    assert overflow.reward.value == 0.0 and not overflow.masked
    # The same override read by Harbor's own model gives the same decision.
    harbor = ErrorPolicyOverride.model_validate({"has_valid_reward": False})
    assert policy.decision(sample(failure=FailureKind.AGENT_TIMEOUT)) == policy_for(
        "AgentTimeoutError", harbor)
    unmasked = FailurePolicy(CollectorConfig.model_validate(
        {"override_error_policy": {"EnvironmentStartTimeoutError": {"has_valid_reward": True}}}))
    assert not unmasked.finalize(sample(failure=FailureKind.INFRA), 0).masked
    with pytest.raises(UserError, match="AgentTimeOutError"):
        FailurePolicy(CollectorConfig.model_validate(
            {"override_error_policy": {"AgentTimeOutError": {"should_retry": True}}}))


def test_a_masked_sample_masks_its_group_in_the_store_when_asked():
    members = [sample(2), sample(0, failure=FailureKind.INFRA), sample(1)]
    group = FailurePolicy(CollectorConfig(mask_group_on_failure=True)).group("demo/t", members)
    assert [t.sample_index for t in group.trajectories] == [0, 1, 2]
    assert all(t.masked for t in group.trajectories)
    assert group.trajectories[0].mask_reason == "why"  # its own reason stays
    assert group.trajectories[1].mask_reason == "group member 0 masked: why"
    alone = FailurePolicy(CollectorConfig()).group("demo/t", members)
    assert [t.masked for t in alone.trajectories] == [True, False, False]
    clean = FailurePolicy(CollectorConfig()).group("demo/t", [sample(0), sample(1)])
    assert not any(t.masked for t in clean.trajectories)
    metrics = group_metrics([group, alone, clean])
    assert metrics["masked/infra"] == 2.0 and metrics["masked/other"] == 2.0


@pytest.mark.parametrize("error, failure, finish, masked", [
    (None, None, FinishReason.STOP, False),
    ("AgentTimeoutError", FailureKind.AGENT_TIMEOUT, FinishReason.AGENT_TIMEOUT, False),
    ("ContextLengthExceededError", None, FinishReason.CONTEXT_OVERFLOW, False),
    ("EnvironmentStartTimeoutError", FailureKind.INFRA, FinishReason.ERROR, True),
    ("ApiRateLimitError", FailureKind.INFRA, FinishReason.ERROR, True),  # Harbor's only
    ("BadRequestError", FailureKind.AGENT_CRASH, FinishReason.ERROR, True),
    ("SomethingNewError", FailureKind.INFRA, FinishReason.ERROR, False),  # Harbor: retry, valid
])
def test_a_harbor_rollouts_error_is_read_as_harbor_decides_it(error, failure, finish, masked):
    from skyrl_agent.harbor.results import harbor_error

    decided = harbor_error(error)
    assert (decided.failure, decided.finish_reason, decided.masked) == (failure, finish, masked)


def test_harbors_rewards_are_read_like_its_verifier_writes_them():
    from skyrl_agent.harbor.results import harbor_reward

    assert harbor_reward({"reward": 1, "tests": None}, "x") == Reward(1.0, {"reward": 1.0})
    assert harbor_reward({"a": 1, "b": 0}, "x").value == 0.5
    missing = harbor_reward(None, "no reward file")
    assert missing.value == 0.0 and missing.reason == "no reward file"
