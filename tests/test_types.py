"""Invariants of the data types every stage shares."""

from __future__ import annotations

import dataclasses

import pytest

from skyrl_agent.types import FinishReason, Reward, Segment, Trajectory, TrajectoryGroup, Turn


def turn(prompt, completion, version=0) -> Turn:
    return Turn(prompt_ids=tuple(prompt), completion_ids=tuple(completion),
                completion_logprobs=tuple(-0.5 for _ in completion),
                loss_mask=tuple(1 for _ in completion), policy_version=version,
                finish_reason=FinishReason.STOP)


def test_turn_lengths_must_agree():
    with pytest.raises(ValueError, match="2 completion ids"):
        Turn((1,), (2, 3), (-0.1,), (1, 1), 0, FinishReason.STOP)


def test_segment_consistency():
    good = Segment((turn([1, 2], [3]), turn([1, 2, 3, 4], [5])))
    bad = Segment((turn([1, 2], [3]), turn([1, 2, 9, 4], [5])))
    assert good.is_token_consistent()
    assert not bad.is_token_consistent()


def test_reward_rejects_non_finite_and_is_frozen():
    with pytest.raises(ValueError):
        Reward(float("nan"))
    reward = Reward(1.0, {"a": 1.0})
    with pytest.raises(dataclasses.FrozenInstanceError):
        reward.value = 0.0
    with pytest.raises(TypeError):
        reward.components["a"] = 0.0


def test_masked_trajectory_needs_reason_and_groups_hold_one_task():
    segment = Segment((turn([1], [2]),))
    with pytest.raises(ValueError, match="mask_reason"):
        Trajectory("t", 0, "nop", (segment,), Reward(0.0), FinishReason.ERROR, masked=True)
    ok = Trajectory("t", 0, "nop", (segment,), Reward(1.0), FinishReason.STOP)
    other = dataclasses.replace(ok, task_id="u")
    assert TrajectoryGroup("t", (ok,)).rewards == (1.0,)
    assert ok.num_turns == 1
    with pytest.raises(ValueError, match="holds trajectories"):
        TrajectoryGroup("t", (ok, other))
