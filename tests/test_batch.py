"""Trajectories into training data: one sequence per segment, loss exactly on sampled tokens."""

from __future__ import annotations

import pytest

from skyrl_agent.backends.backend import Datum
from skyrl_agent.rl.batch import (
    group_advantages,
    groups_to_batch,
    pack_turns,
    sft_data,
    trajectory_data,
)
from skyrl_agent.types import FinishReason, Reward, Segment, Trajectory, TrajectoryGroup, Turn


def turn(prompt, completion, logprobs, version, mask=None, versions=None) -> Turn:
    return Turn(prompt_ids=tuple(prompt), completion_ids=tuple(completion),
                completion_logprobs=tuple(logprobs),
                loss_mask=tuple(mask or [1] * len(completion)), policy_version=version,
                finish_reason=FinishReason.STOP, token_policy_versions=versions)


def trajectory(segments, reward=1.0, masked=False, index=0) -> Trajectory:
    return Trajectory("t", index, "a", tuple(segments), Reward(reward), FinishReason.STOP,
                      masked=masked, mask_reason="infra" if masked else None)


# Segment 1: prompt [1 2] -> sampled [3 4]; observation [5]; sampled [6] (then summarized: the
# summary turn [7] answers the prompt [1 2 3 4 5 6 70]). Segment 2: a fresh prompt [8 9] ->
# sampled [10 11], with a weight update in the middle of the turn (versions 1 then 2).
SEGMENT_1 = Segment((turn([1, 2], [3, 4], [-0.1, -0.2], 0),
                     turn([1, 2, 3, 4, 5], [6], [-0.3], 0),
                     turn([1, 2, 3, 4, 5, 6, 70], [7], [-0.4], 1)), summary_turn_index=2)
SEGMENT_2 = Segment((turn([8, 9], [10, 11], [-0.5, -0.6], 1, versions=(1, 2)),))


def test_a_summarized_trajectory_is_two_sequences_trained_exactly_on_its_sampled_tokens():
    data = trajectory_data(trajectory([SEGMENT_1, SEGMENT_2]), advantage=0.5)
    assert len(data) == 2
    first, second = data
    # Sequence [1 2 3 4 5 6 70 7]: the model reads all but the last token and predicts the next.
    assert first.model_input == (1, 2, 3, 4, 5, 6, 70)
    assert first.loss_fn_inputs["target_tokens"] == (2, 3, 4, 5, 6, 70, 7)
    assert first.loss_fn_inputs["weights"] == (0, 1, 1, 0, 1, 0, 1)
    assert first.loss_fn_inputs["logprobs"] == (0, -0.1, -0.2, 0, -0.3, 0, -0.4)
    assert first.loss_fn_inputs["advantages"] == (0, 0.5, 0.5, 0, 0.5, 0, 0.5)  # summary too
    assert first.loss_fn_inputs["policy_versions"] == (0, 0, 0, 0, 0, 0, 1)
    assert second.model_input == (8, 9, 10)
    assert second.loss_fn_inputs["weights"] == (0, 1, 1)
    assert second.loss_fn_inputs["logprobs"] == (0, -0.5, -0.6)
    # The update came mid-turn on a server that kept the old weights' KV cache: the token after
    # it was sampled by neither version alone.
    assert second.loss_fn_inputs["policy_versions"] == (0, 1, -1)


def test_packing_reads_each_token_once():
    """Per-turn samples would read 2 + 5 + 7 prompt tokens for segment 1; packed, 7."""
    [datum] = trajectory_data(trajectory([SEGMENT_1]), advantage=1.0)
    assert len(datum.model_input) == len(SEGMENT_1.turns[-1].prompt_ids)


def test_a_turn_mask_of_zero_is_respected():
    segment = Segment((turn([1, 2], [3, 4], [-0.1, -0.2], 0, mask=[1, 0]),))
    [datum] = trajectory_data(trajectory([segment]), 1.0)
    assert datum.loss_fn_inputs["weights"] == (0, 1, 0)


def test_a_prompt_that_rewrites_history_starts_a_new_sequence():
    broken = Segment((turn([1, 2], [3], [-0.1], 0), turn([1, 9, 3, 4], [5], [-0.2], 0)))
    data = trajectory_data(trajectory([broken]), 1.0)
    assert [d.model_input for d in data] == [(1, 2), (1, 9, 3, 4)]
    assert [d.loss_fn_inputs["weights"] for d in data] == [(0, 1), (0, 0, 0, 1)]


def test_a_group_with_a_masked_member_is_dropped_whole_and_counted():
    """Stops: training on a group's survivors, whose advantage is biased toward the samples
    that did not fail."""
    kept = [trajectory([SEGMENT_2], reward=r, index=i) for i, r in enumerate([1.0, 0.0])]
    masked = trajectory([SEGMENT_2], reward=1.0, masked=True, index=2)
    clean = TrajectoryGroup("t", tuple(kept))  # the same task drawn again
    batch = groups_to_batch([TrajectoryGroup("t", (*kept, masked)), clean], "grpo")
    assert batch.dropped_groups == 1 and batch.masked == 1
    assert batch.trajectories == 2 and len(batch.data) == 2  # the clean group's two
    assert batch.advantages[0] == [0.0, 0.0, 0.0]
    assert batch.advantages[1] == pytest.approx([0.70710, -0.70710], abs=1e-4)
    # Masked samples are still left out of the statistics where they are asked for.
    advantages = group_advantages([TrajectoryGroup("t", (*kept, masked))], "grpo")
    assert advantages[0][:2] == pytest.approx([0.70710, -0.70710], abs=1e-4)
    assert sft_data([masked]) == []


def test_uniform_groups_can_be_left_out_of_the_batch():
    mixed = TrajectoryGroup("t", tuple(trajectory([SEGMENT_2], reward=r, index=i)
                                       for i, r in enumerate([1.0, 0.0])))
    passed = [trajectory([SEGMENT_2], reward=1.0, index=i) for i in range(2)]
    uniform = TrajectoryGroup("t", tuple(passed))
    kept = groups_to_batch([mixed, uniform], "grpo")
    assert len(kept.data) == 4 and kept.uniform_groups == 0 and kept.masked == 0
    skipped = groups_to_batch([mixed, uniform], "grpo", skip_uniform=True)
    assert len(skipped.data) == 2 and skipped.uniform_groups == 1 and skipped.masked == 0
    assert skipped.trajectories == 2
    assert [d.loss_fn_inputs for d in skipped.data] == [d.loss_fn_inputs for d in kept.data[:2]]


def test_skipping_uniform_groups_never_skips_a_whole_step(tiny_model_dir):
    from skyrl_agent.backends.torch_backend import TorchBackend
    from skyrl_agent.config import load_config
    from skyrl_agent.rl.step import train_on

    config = load_config(None, ["trainer.skip_uniform_groups=true"])
    uniform = TrajectoryGroup("t", tuple(trajectory([SEGMENT_2], reward=0.0, index=i)
                                         for i in range(2)))
    mixed = TrajectoryGroup("t", tuple(trajectory([SEGMENT_2], reward=r, index=i)
                                       for i, r in enumerate([1.0, 0.0])))
    backend = TorchBackend(tiny_model_dir)
    both = train_on(backend, config, [mixed, uniform])
    assert both["uniform_groups"] == 1 and both["sequences"] == 2 and backend.step == 1
    alone = train_on(backend, config, [uniform])
    assert alone["uniform_groups"] == 1 and alone["sequences"] == 2 and backend.step == 2


def test_a_datum_rejects_misaligned_arrays():
    with pytest.raises(ValueError, match="2 entries for 3"):
        Datum((1, 2, 3), {"target_tokens": (2, 3)})
    with pytest.raises(ValueError, match="unknown datum arrays"):
        Datum((1,), {"target_tokens": (2,), "rewards": (1,)})
    assert pack_turns([turn([1], [], [], 0)], 1.0) is None


def test_agreement_counts_tokens_their_version_alone_sampled():
    """A turn that crossed an update on a server keeping its old KV cache (the embedded one)
    counts only up to the update; one whose server re-prefilled (vLLM) counts per token."""
    import dataclasses

    from skyrl_agent.backends.passes import sampled_by

    kept = turn([0], [1, 1, 1], [-0.1] * 3, 1, versions=(1, 2, 2))
    recomputed = dataclasses.replace(kept, versions_exact=True)
    whole = turn([0], [1, 1], [-0.1] * 2, 2, versions=(2, 2))
    data = [pack_turns([t], 1.0) for t in (kept, recomputed, whole)]
    packed = [d for d in data if d is not None]
    assert [d.loss_fn_inputs["policy_versions"] for d in packed] == [
        (1, -1, -1), (1, 2, 2), (2, 2)]
    assert sampled_by(packed, 2).tolist() == [[False, False, False], [False, True, True],
                                              [True, True, False]]
    assert sampled_by(packed, 1)[0].tolist() == [True, False, False]
