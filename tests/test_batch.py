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


def test_sft_data_weighs_every_sampled_token_by_one():
    """Supervised data is the RL data with advantage 1: the loss falls on the sampled tokens
    (weight 1, advantage 1) and nowhere else. Stops: any other advantage (a scaled SFT step)."""
    [datum] = sft_data([trajectory([SEGMENT_2], reward=0.0)])
    weights = datum.loss_fn_inputs["weights"]
    assert weights == (0, 1, 1)
    assert datum.loss_fn_inputs["advantages"] == weights


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


# Turn 2's prompt is turn 1's prompt + completion with nothing added (the agent sent no
# observation), so its sampled tokens follow turn 1's with no weight-0 gap between them.
ABUTTING = Segment((turn([1, 2], [3, 4], [-0.1, -0.2], 1, versions=(1, 2)),
                    turn([1, 2, 3, 4], [5, 6], [-0.3, -0.4], 2)))


def test_abutting_turns_carry_where_each_starts():
    """Stops: a turn boundary guessed from gaps in the weights (the pre-02e5969 sampled_by). With
    no gap between abutting turns that guess saw one turn; packing now writes the starts."""
    from skyrl_agent.backends.passes import sampled_by

    [datum] = trajectory_data(trajectory([ABUTTING]), 1.0)
    assert datum.loss_fn_inputs["weights"] == (0, 1, 1, 1, 1)
    gap_guess = [i for i, w in enumerate(datum.array("weights")) if w and not
                 (i and datum.array("weights")[i - 1])]
    assert gap_guess == [1]  # one run of sampled tokens: the gap guess finds one turn
    assert datum.turn_starts == (0, 3)
    assert datum.loss_fn_inputs["target_tokens"][3] == ABUTTING.turns[1].completion_ids[0]
    # Turn 1 crossed an update on a server that kept its KV cache; turn 2 started afresh under
    # version 2, so its tokens are version 2's own sample (the gap guess counted them stale).
    assert datum.loss_fn_inputs["policy_versions"] == (0, 1, -1, 2, 2)
    assert sampled_by([datum], 2).tolist() == [[False, False, False, True, True]]


def test_a_summary_boundary_starts_a_sequence_with_its_own_turn_starts():
    first, second = trajectory_data(trajectory([SEGMENT_1, SEGMENT_2]), 1.0)
    # Segment 1: turn 2 adds observation [5] after [1 2 3 4], turn 3 adds [70] after [... 6].
    assert first.turn_starts == (0, 3, 5)
    assert [first.loss_fn_inputs["target_tokens"][s] for s in first.turn_starts[1:]] == [5, 70]
    assert second.turn_starts == (0,)  # the summarized history is a sequence of its own


def test_a_datum_keeps_integers_integer_and_its_turn_starts_across_processes():
    """Stops: token ids or versions passed as floats (a float32 holds ids exactly only up to
    2**24) and turn starts lost on the way to a rank process (data travel by pickle)."""
    import pickle

    [datum] = trajectory_data(trajectory([ABUTTING]), 1.0)
    assert all(type(v) is int for name in ("target_tokens", "policy_versions")
               for v in datum.loss_fn_inputs[name])
    back = pickle.loads(pickle.dumps(datum))
    assert back == datum and back.turn_starts == (0, 3)
    with pytest.raises(ValueError, match=r"target_tokens must hold integers, got 2\.0"):
        Datum((1,), {"target_tokens": (2.0,)})
    with pytest.raises(ValueError, match="policy_versions must hold integers"):
        Datum((1,), {"target_tokens": (2,), "policy_versions": (0.5,)})
    with pytest.raises(ValueError, match="turn_starts"):
        Datum((1, 2), {"target_tokens": (2, 3)}, turn_starts=(0, 3))
    with pytest.raises(ValueError, match="turn_starts"):
        Datum((1, 2), {"target_tokens": (2, 3)}, turn_starts=(1,))


BIG_ID = 2**24 + 1
"""The first integer a float32 cannot hold: float32(16_777_217) == 16_777_216."""


def test_a_token_id_above_2_to_the_24_survives_packing_and_the_forward(tmp_path):
    """Stops: ids stacked through float32 (the backends' `stack(...).long()`), which scored the
    neighbouring id 2**24 instead of 2**24 + 1."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from skyrl_agent.backends.passes import stack
    from skyrl_agent.backends.torch_backend import TorchBackend

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=BIG_ID + 1, hidden_size=2, intermediate_size=4,
                         num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1,
                         max_position_embeddings=8, tie_word_embeddings=True)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    with torch.no_grad():  # make the two ids' logits far apart
        model.model.embed_tokens.weight[BIG_ID] *= 1000
    model.save_pretrained(tmp_path)
    segment = Segment((turn([5, 7], [BIG_ID], [-1.0], 0),))
    [datum] = trajectory_data(trajectory([segment]), 1.0)
    assert datum.loss_fn_inputs["target_tokens"] == (7, BIG_ID)
    assert stack([datum], "target_tokens").tolist() == [[7, BIG_ID]]
    backend = TorchBackend(tmp_path, dtype="float32")
    with torch.no_grad():
        logits = backend.model(input_ids=torch.tensor([[5, 7]], device=backend.device)
                               ).logits[0, 1].double().cpu()
    own, neighbour = logits.log_softmax(-1)[[BIG_ID, BIG_ID - 1]].tolist()
    assert abs(own - neighbour) > 1.0
    [logprobs] = backend.forward([datum])
    assert logprobs[1] == pytest.approx(own, abs=1e-3)
