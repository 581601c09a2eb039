"""Trajectories into training data in O(T) tokens: one sequence per segment, not one per turn.

Within a segment every turn's prompt extends the previous prompt + completion, so the last turn's
prompt + completion holds the whole segment: one forward pass over it scores every turn. Per-turn
training (one sample per model call) would re-read the growing prefix at every turn, O(T^2)
tokens for T tokens of conversation.

The loss falls only on sampled tokens (the turns' `loss_mask`), each carrying the trajectory's
advantage, its sampling logprob and the policy version that sampled it. A summary turn is a
sampled turn like any other: it is trained with the trajectory's advantage. Observations and
prompts get weight 0. A masked trajectory yields no data, so it moves no weight. Each datum
carries where its turns start (`Datum.turn_starts`): a turn's prompt may add nothing after the
previous completion, so no gap in the weights marks the boundary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from skyrl_agent.backends.backend import Datum
from skyrl_agent.rl.advantages import compute_advantages
from skyrl_agent.types import Segment, Trajectory, TrajectoryGroup, Turn

NO_VERSION = -1
"""A sampled token's version where no one version's weights gave its distribution."""


def consistent_runs(segment: Segment) -> list[tuple[Turn, ...]]:
    """The segment's turns, split wherever a prompt does not extend the history before it.

    Sessions record token-consistent segments by construction, so this is normally one run; a
    split keeps a broken record trainable without ever training on tokens the model did not see.
    """
    runs: list[list[Turn]] = []
    history: tuple[int, ...] | None = None
    for turn in segment.turns:
        if history is None or turn.prompt_ids[: len(history)] != history:
            runs.append([])
        runs[-1].append(turn)
        history = turn.prompt_ids + turn.completion_ids
    return [tuple(run) for run in runs]


def pack_turns(turns: Sequence[Turn], advantage: float) -> Datum | None:
    """One datum for turns that extend each other; None when nothing in it is trained."""
    last = turns[-1]
    sequence = last.prompt_ids + last.completion_ids
    length = len(sequence)
    weights = [0.0] * length
    logprobs = [0.0] * length
    versions = [0] * length
    for turn in turns:
        start = len(turn.prompt_ids)
        per_token = sampling_versions(turn)
        for offset, (mask, logprob, version) in enumerate(
                zip(turn.loss_mask, turn.completion_logprobs, per_token, strict=True)):
            weights[start + offset] = float(mask)
            logprobs[start + offset] = logprob
            versions[start + offset] = version
    if length < 2 or not any(weights[1:]):
        return None
    # Position i of a datum describes sequence[i + 1], the token predicted from the first i + 1.
    return Datum(model_input=sequence[:-1], routed_experts=routing_of(turns, length - 1),
                 images=last.images, turn_starts=turn_starts(turns), loss_fn_inputs={
        "target_tokens": sequence[1:],
        "weights": tuple(weights[1:]),
        "logprobs": tuple(logprobs[1:]),
        "advantages": tuple(advantage * w for w in weights[1:]),
        "policy_versions": tuple(versions[1:]),
    })


def turn_starts(turns: Sequence[Turn]) -> tuple[int, ...]:
    """Per turn, the first datum position whose target is a token the turn added (the first
    after the previous turn's prompt + completion); 0 for the first turn, whose first token is
    no position's target."""
    ends = [len(turn.prompt_ids) + len(turn.completion_ids) for turn in turns[:-1]]
    return (0, *(max(end - 1, 0) for end in ends))


def sampling_versions(turn: Turn) -> tuple[int, ...]:
    """Per sampled token, the weight version whose weights alone gave its distribution; -1
    (none) after an update inside a turn whose server kept the older weights' KV cache. What
    the trainer's agreement check compares against (trainers.passes.sampled_by)."""
    versions = turn.token_policy_versions or (turn.policy_version,) * len(turn.completion_ids)
    if turn.versions_exact or not versions:
        return tuple(versions)
    first = versions[0]
    changed = next((i for i, v in enumerate(versions) if v != first), len(versions))
    return (*versions[:changed], *(NO_VERSION,) * (len(versions) - changed))


def routing_of(turns: Sequence[Turn], positions: int) -> np.ndarray | None:
    """[positions, layers, top_k]: the experts the sampler routed each of the first `positions`
    tokens to, from the turns' records (the first record of a position wins: it is the one the
    tokens sampled right after it saw); -1 where none was recorded. None without records."""
    records = [t.routed_experts for t in turns if t.routed_experts is not None]
    if not records:
        return None
    out = np.full((positions, records[0].layers, records[0].top_k), -1, dtype=np.int32)
    filled = np.zeros(positions, dtype=bool)
    for record in records:
        if (record.layers, record.top_k) != out.shape[1:]:
            raise ValueError(f"a turn's routing has {record.layers} layers x top-"
                             f"{record.top_k}; the segment's first has {out.shape[1]} x "
                             f"top-{out.shape[2]}")
        end = min(record.end, positions)
        if end <= record.start:
            continue
        rows = record.array()[: end - record.start]
        fresh = ~filled[record.start:end]
        out[record.start:end][fresh] = rows[fresh]
        filled[record.start:end] = True
    return out


def trajectory_data(trajectory: Trajectory, advantage: float) -> list[Datum]:
    """The trajectory's sequences (normally one per segment); none when it is masked."""
    if trajectory.masked:
        return []
    data = []
    for segment in trajectory.segments:
        for run in consistent_runs(segment):
            datum = pack_turns(run, advantage)
            if datum is not None:
                data.append(datum)
    return data


@dataclass(frozen=True)
class TrainingBatch:
    """Groups turned into data, with what the step reports about them."""

    data: list[Datum]
    """One datum per sequence of every unmasked trajectory."""
    advantages: list[list[float]]
    """Per group, per trajectory, the advantage (0 for masked ones)."""
    trajectories: int
    """Trajectories that contributed data."""
    masked: int
    """Trajectories left out because they are masked."""
    uniform_groups: int = 0
    """Groups left out because every advantage in them is 0 (with skip_uniform)."""
    dropped_groups: int = 0
    """Groups left out because a member is masked: an advantage computed without the failed
    sample would be biased toward the samples that did not fail."""


def group_advantages(groups: Sequence[TrajectoryGroup], estimator: str) -> list[list[float]]:
    """Per group, per trajectory, the advantage under `estimator`; masked trajectories are left
    out of every statistic and get 0."""
    width = max((len(g.trajectories) for g in groups), default=0)
    rewards_GN = torch.zeros(len(groups), width, dtype=torch.float64)
    valid_GN = torch.zeros(len(groups), width, dtype=torch.bool)
    for g, group in enumerate(groups):
        for n, trajectory in enumerate(group.trajectories):
            rewards_GN[g, n] = trajectory.reward.value
            valid_GN[g, n] = not trajectory.masked
    advantages_GN = compute_advantages(estimator, rewards_GN, valid_GN)
    return [advantages_GN[g, : len(group.trajectories)].tolist() for g, group in enumerate(groups)]


def groups_to_batch(groups: Sequence[TrajectoryGroup], estimator: str,
                    skip_uniform: bool = False) -> TrainingBatch:
    """Advantages within each group, then every unmasked trajectory packed into sequences.

    A group with a masked member (a failure whose reward is not valid, after its retries)
    gives no data and is counted: leaving only the failed sample out would bias the group's
    advantage. With `skip_uniform`, a group whose advantages are all 0 (every sample got the
    same reward) gives no data: its policy-gradient term is 0, so it would cost a forward and
    backward pass and change only the token-mean denominator (DAPO's dynamic sampling, Yu et al.
    2025)."""
    advantages = group_advantages(groups, estimator)
    data: list[Datum] = []
    used = masked = uniform = dropped = 0
    for g, (group, group_adv) in enumerate(zip(groups, advantages, strict=True)):
        if any(t.masked for t in group.trajectories):
            dropped += 1
            masked += sum(t.masked for t in group.trajectories)
            advantages[g] = [0.0] * len(group_adv)
            continue
        if skip_uniform and not any(group_adv):
            uniform += 1
            masked += sum(t.masked for t in group.trajectories)
            continue
        for trajectory, advantage in zip(group.trajectories, group_adv, strict=True):
            if trajectory.masked:
                masked += 1
                continue
            sequences = trajectory_data(trajectory, advantage)
            used += bool(sequences)
            data.extend(sequences)
    return TrainingBatch(data, advantages, used, masked, uniform, dropped)


def sft_data(trajectories: Sequence[Trajectory]) -> list[Datum]:
    """Supervised data: every sampled token of every unmasked trajectory, weight 1."""
    return [datum for t in trajectories for datum in trajectory_data(t, 1.0)]
