"""One forward/backward pass over some rows of a batch, and the merge of such passes.

A backend that splits a batch over data-parallel ranks runs `PartialPass`es, one per rank, and
merges them with `merge_passes`; a one-process backend runs one pass over every row and merges
that alone. Both end in the same `ForwardBackwardOutput`, so the metrics cannot drift between
backends. Also the small tensor helpers both need: padding datum arrays to [B, T] and back.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from skyrl_agent.backends.algorithms.reductions import token_weights
from skyrl_agent.backends.backend import INTEGER_ARRAYS, Datum, ForwardBackwardOutput
from skyrl_agent.backends.loss import (
    LOSS_FNS,
    LossConfig,
    MicroBatch,
    agreement,
    micro_batch_loss,
    parse_loss_config,
)
from skyrl_agent.model.vision import ImageInputs

STAND_IN = Datum((0,), {"target_tokens": (0,), "weights": (0.0,)})
"""A one-token datum with no loss weight. A rank with fewer micro-batches than its peers runs it
instead: every rank must take part in each collective of a sharded forward and backward, and a
stand-in adds exactly zero to the loss and the gradient."""


def checked_call(data: Sequence[Datum], loss_fn: str,
                 loss_fn_config: LossConfig | Mapping[str, Any] | None) -> LossConfig:
    """The parsed loss config of a forward_backward call, refused before any work if bad."""
    config = parse_loss_config(loss_fn_config)
    if loss_fn not in LOSS_FNS:
        raise ValueError(f"unknown loss_fn {loss_fn!r}; known: {', '.join(LOSS_FNS)}")
    if not data:
        raise ValueError("forward_backward needs at least one datum")
    return config


@dataclass
class PartialPass:
    """What one pass over some rows of the batch produced (tensors on CPU)."""

    loss: float = 0.0
    """The sum of these rows' share of the batch loss."""
    logprobs: dict[int, tuple[float, ...]] = field(default_factory=dict)
    """Per row of the batch (its index), the trainer's logprob of each target."""
    metric_sums: dict[str, float] = field(default_factory=dict)
    """Each micro-batch metric times its loss tokens, summed."""
    trainer_N: list[torch.Tensor] = field(default_factory=list)
    """Per micro-batch, the trainer's logprobs of the loss tokens."""
    sampler_N: list[torch.Tensor] = field(default_factory=list)
    """The sampler's logprobs of the same tokens."""
    current_N: list[torch.Tensor] = field(default_factory=list)
    """True where the current policy version sampled the token (see `sampled_by`)."""
    entropy_N: list[torch.Tensor] = field(default_factory=list)
    """The trainer's entropy at each loss token."""


def merge_passes(data: Sequence[Datum], passes: Sequence[PartialPass]) -> ForwardBackwardOutput:
    """The batch's output from passes that together covered every row once."""
    logprobs: dict[int, tuple[float, ...]] = {}
    sums: dict[str, float] = {}
    for part in passes:
        logprobs.update(part.logprobs)
        for key, value in part.metric_sums.items():
            sums[key] = sums.get(key, 0.0) + value
    if sorted(logprobs) != list(range(len(data))):
        raise RuntimeError("the passes did not cover every row of the batch exactly once")
    total = sum(part.loss for part in passes)
    tokens = sum(d.num_loss_tokens for d in data)
    metrics = {key: value / max(tokens, 1) for key, value in sums.items()}
    metrics["loss"] = total
    metrics["tokens"] = float(tokens)
    entropy = _cat([t for part in passes for t in part.entropy_N], torch.float32)
    metrics["entropy"] = float(entropy.mean()) if tokens else 0.0
    if any("logprobs" in d.loss_fn_inputs for d in data):
        # Agreement on the tokens the current weights sampled (a bug detector); the rest
        # measure how off-policy the batch is.
        trainer = _cat([t for part in passes for t in part.trainer_N], torch.float32)
        sampler = _cat([t for part in passes for t in part.sampler_N], torch.float32)
        current = _cat([t for part in passes for t in part.current_N], torch.bool)
        metrics.update(agreement(trainer[current], sampler[current]))
        if not bool(current.all()):
            stale = agreement(trainer[~current], sampler[~current])
            metrics.update({k.replace("agreement/", "off_policy/"): v for k, v in stale.items()})
    return ForwardBackwardOutput(total, tuple(logprobs[i] for i in range(len(data))), metrics)


def forward_loss(data: Sequence[Datum], logprobs: Sequence[Sequence[float]], loss_fn: str,
                 config: LossConfig) -> dict[str, float]:
    """The loss (and the loss's metrics) forward_backward would report for these rows at
    weights whose logprobs of the targets are `logprobs`, without a gradient: what a
    forward-only pass returns beside the logprobs."""
    if config.kl_coef > 0:
        raise ValueError("a forward-only pass has no reference logprobs: kl_coef needs "
                         "forward_backward")
    logprobs_BT = torch.zeros(len(data), max(len(d.model_input) for d in data))
    for row, values in enumerate(logprobs):
        logprobs_BT[row, : len(values)] = torch.tensor(values, dtype=torch.float64)
    weights_BT = stack(data, "weights")
    batch = MicroBatch(logprobs_BT, weights_BT,
                       token_weights(weights_BT, config.reduction, config.norm_len),
                       stack(data, "logprobs"), stack(data, "advantages"))
    with torch.no_grad():
        loss, metrics = micro_batch_loss(loss_fn, config, batch)
    return {**metrics, "loss": float(loss)}


def _cat(parts: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    return torch.cat(parts) if parts else torch.zeros(0, dtype=dtype)


def split_by_tokens(data: Sequence[Datum], ranks: int) -> list[list[int]]:
    """Rows for each rank, balanced by input tokens (longest rows first, each to the rank with
    the fewest tokens so far); each rank's rows keep the batch's order."""
    shares: list[list[int]] = [[] for _ in range(ranks)]
    loads = [0] * ranks
    for row in sorted(range(len(data)), key=lambda i: -len(data[i].model_input)):
        rank = loads.index(min(loads))
        shares[rank].append(row)
        loads[rank] += len(data[row].model_input)
    return [sorted(share) for share in shares]


def micro_batches(data: Sequence[Datum], rows: Sequence[int], budget: int) -> list[list[int]]:
    """Consecutive `rows` whose padded size fits `budget` tokens (a longer row alone)."""
    out: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for row in rows:
        length = len(data[row].model_input)
        if current and max(longest, length) * (len(current) + 1) > budget:
            out.append(current)
            current, longest = [], 0
        current.append(row)
        longest = max(longest, length)
    if current:
        out.append(current)
    return out


def stack(data: Sequence[Datum], name: str, device: torch.device | None = None) -> torch.Tensor:
    """A named per-position array of every datum, right-padded with zeros: [B, T]; int64 for
    the integer arrays (token ids, versions), which never pass through a float, else float32."""
    width = max((len(d.model_input) for d in data), default=0)
    integer = name in INTEGER_ARRAYS
    out = torch.zeros(len(data), width, dtype=torch.long if integer else torch.float32)
    for row, datum in enumerate(data):
        if name in datum.loss_fn_inputs:
            out[row, : len(datum.model_input)] = torch.tensor(
                datum.loss_fn_inputs[name], dtype=torch.long if integer else torch.float64)
    return out if device is None else out.to(device)


def stack_routing(data: Sequence[Datum], rows: int, width: int) -> torch.Tensor | None:
    """[rows, width, layers, top_k]: every datum's recorded MoE routing, padded with -1 (no
    record: the router chooses itself); None when no datum carries routing."""
    records = [d.routed_experts for d in data if d.routed_experts is not None]
    if not records:
        return None
    out = torch.full((rows, width, *records[0].shape[1:]), -1, dtype=torch.long)
    for row, datum in enumerate(data):
        if datum.routed_experts is not None:
            out[row, : len(datum.model_input)] = torch.from_numpy(datum.routed_experts)
    return out


def sampled_by(data: Sequence[Datum], version: int) -> torch.Tensor:
    """[B, T]: True where `version`'s weights alone sampled the token (its datum's
    `policy_versions`, which packing writes per turn, see rl.batch.sampling_versions): what
    agreement compares."""
    width = max(len(d.model_input) for d in data)
    out = torch.zeros(len(data), width, dtype=torch.bool)
    for row, datum in enumerate(data):
        weights = torch.tensor(datum.array("weights"))
        versions = datum.integers("policy_versions")
        sampled = weights != 0
        if versions is not None:
            sampled &= torch.tensor(versions, dtype=torch.long) == version
        out[row, : len(weights)] = sampled
    return out


def unpad(values_BT: torch.Tensor, data: Sequence[Datum]) -> list[tuple[float, ...]]:
    return [tuple(values_BT[row, : len(d.model_input)].tolist()) for row, d in enumerate(data)]


def pixel_inputs(images: ImageInputs | None, data: Sequence[Datum],
                 device: torch.device | None = None) -> dict[str, Any]:
    """The pixel inputs of every image the rows show, in row order (the order a VLM fills its
    image tokens in); each row's placement is checked first: an image token without its image,
    or an image over other tokens, would train on something the sampler never saw."""
    if images is None:
        if any(datum.images for datum in data):
            raise ValueError("a datum carries images but this model is not a vision model")
        return {}
    for datum in data:
        images.check_placement(datum.model_input, datum.images)
    return images.model_kwargs([image.data for datum in data for image in datum.images], device)


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(saved: dict[str, Any] | list[dict[str, Any]], rank: int = 0) -> None:
    """Restore `rng_state()`, or rank `rank`'s of a sharded backend's list of them (rank 0's
    when the checkpoint had fewer ranks)."""
    state = (saved[rank] if rank < len(saved) else saved[0]) if isinstance(saved, list) \
        else saved
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
