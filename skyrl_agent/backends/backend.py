"""The trainer backend protocol: Tinker's primitives, which every loop speaks.

The RL loops, SFT and (later) the Tinker-compatible server drive a backend only through these
calls; torch (CPU or one GPU) implements them here, Megatron on GPUs.

A `Datum` is one training sequence in Tinker's layout: `model_input` is the tokens the model
reads (the sequence without its last token) and every array in `loss_fn_inputs` has one entry
per input position, describing the token that follows it (`target_tokens[i]` = sequence[i+1]).
Token ids and policy versions are integers from the session to the loss: a float32 holds
integers exactly only up to 2**24, so no integer array ever passes through a float.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol, cast

import numpy as np

from skyrl_agent.backends.loss import LossConfig
from skyrl_agent.model.weights.transport import WeightUpdate
from skyrl_agent.types import PlacedImage

DATUM_ARRAYS = ("target_tokens", "weights", "logprobs", "advantages", "policy_versions")
"""Per-position arrays a datum may carry: the next token; its loss weight (1 on sampled tokens,
0 elsewhere); its sampling logprob; its advantage; the policy version that sampled it."""
INTEGER_ARRAYS = ("target_tokens", "policy_versions")
"""The arrays of integers: held as Python ints and stacked as int64, never as floats."""


@dataclass(frozen=True)
class Datum:
    """One training sequence: the tokens the model reads and per-position arrays."""

    model_input: tuple[int, ...]
    """Token ids the model reads: the sequence without its last token."""
    loss_fn_inputs: Mapping[str, tuple[int, ...] | tuple[float, ...]]
    """Named per-position arrays (see DATUM_ARRAYS); `target_tokens` is required. Those in
    INTEGER_ARRAYS must hold integers (a float there is refused, not rounded)."""
    routed_experts: np.ndarray | None = field(default=None, compare=False)
    """MoE models, Rollout Routing Replay: [input tokens, layers, top_k] experts the sampler
    routed each input token to; -1 where nothing was recorded (the trainer routes itself)."""
    images: tuple[PlacedImage, ...] = ()
    """Vision models: the images the input shows, each over its span of image tokens."""
    turn_starts: tuple[int, ...] = ()
    """Where each model call (turn) of the sequence begins: turn k owns the positions
    `turn_starts[k]` up to the next turn's start, whose targets are the tokens it added (its
    observation, then its completion); the first turn starts at 0. Written by packing from the
    session's turns, so no one guesses boundaries back from gaps in the weights (abutting turns
    leave none). Empty when unknown (Tinker clients send no turns); an empty turn starts where
    the next one does."""

    def __post_init__(self) -> None:
        if "target_tokens" not in self.loss_fn_inputs:
            raise ValueError("a datum needs target_tokens")
        unknown = set(self.loss_fn_inputs) - set(DATUM_ARRAYS)
        if unknown:
            raise ValueError(f"unknown datum arrays {sorted(unknown)}; known: {DATUM_ARRAYS}")
        object.__setattr__(self, "model_input", _integers("model_input", self.model_input))
        arrays = dict(self.loss_fn_inputs)
        for name, values in arrays.items():
            if len(values) != len(self.model_input):
                raise ValueError(f"datum array {name} has {len(values)} entries for "
                                 f"{len(self.model_input)} input tokens")
            if name in INTEGER_ARRAYS:
                arrays[name] = _integers(name, values)
        starts = _integers("turn_starts", self.turn_starts)
        if starts and (starts[0] != 0 or starts[-1] > len(self.model_input)
                       or any(b < a for a, b in itertools.pairwise(starts))):
            raise ValueError(f"turn_starts {starts[:8]} must rise from 0 and stay within the "
                             f"{len(self.model_input)} input tokens")
        if self.routed_experts is not None and (
                self.routed_experts.ndim != 3
                or self.routed_experts.shape[0] != len(self.model_input)):
            raise ValueError(f"routed_experts of shape {self.routed_experts.shape} for "
                             f"{len(self.model_input)} input tokens")
        if any(image.end > len(self.model_input) for image in self.images):
            raise ValueError(f"an image span runs past the {len(self.model_input)} input tokens")
        object.__setattr__(self, "loss_fn_inputs", MappingProxyType(arrays))
        object.__setattr__(self, "turn_starts", starts)

    def __reduce__(self) -> tuple[Any, ...]:
        # The read-only mapping cannot be pickled; rank processes receive data by pickle.
        return (Datum, (self.model_input, dict(self.loss_fn_inputs), self.routed_experts,
                        self.images, self.turn_starts))

    def array(self, name: str, default: float = 0.0) -> tuple[float, ...]:
        """A named array, or `default` at every position when the datum does not carry it."""
        return self.loss_fn_inputs.get(name) or (default,) * len(self.model_input)

    def integers(self, name: str) -> tuple[int, ...] | None:
        """An integer array (INTEGER_ARRAYS) as the ints it holds; None when not carried."""
        if name not in INTEGER_ARRAYS:
            raise KeyError(f"{name} is not an integer array; those are {INTEGER_ARRAYS}")
        values = self.loss_fn_inputs.get(name)
        return None if values is None else cast(tuple[int, ...], values)

    @property
    def num_loss_tokens(self) -> int:
        return sum(1 for w in self.array("weights") if w)


def _integers(name: str, values: Sequence[Any]) -> tuple[int, ...]:
    """`values` as Python ints; a float (even a whole one) is refused: it means an id went
    through a float somewhere, where ids above 2**24 (float32) or 2**53 (float64) change."""
    try:
        return tuple(map(operator.index, values))
    except TypeError:
        bad = next(v for v in values if not _is_integer(v))
        raise ValueError(f"datum {name} must hold integers, got {bad!r} "
                         f"({type(bad).__name__})") from None


def _is_integer(value: Any) -> bool:
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


@dataclass(frozen=True)
class AdamParams:
    """One optimizer step's settings (Tinker's `adam_params`)."""

    learning_rate: float = 1e-5
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0
    """Clip the global gradient norm to this before stepping (0 = no clipping)."""

    def __post_init__(self) -> None:
        if not (self.learning_rate >= 0 and math.isfinite(self.learning_rate)):
            raise ValueError(f"learning_rate must be finite and >= 0, got {self.learning_rate}")


@dataclass(frozen=True)
class ForwardBackwardOutput:
    """What one forward_backward returns; gradients stay accumulated in the backend."""

    loss: float
    """The reduced loss of the whole batch."""
    logprobs: tuple[tuple[float, ...], ...]
    """Per datum, the trainer's logprob of each target token (before this call's update)."""
    metrics: Mapping[str, float] = field(default_factory=dict)
    """Loss terms, clip fractions, entropy, sampler/trainer agreement (`agreement/...`)."""


@dataclass(frozen=True)
class OptimStepOutput:
    step: int
    """Optimizer steps taken so far, this one included."""
    metrics: Mapping[str, float] = field(default_factory=dict)
    """`grad_norm` (before clipping) and `learning_rate`."""


@dataclass(frozen=True)
class TrainingState:
    """What load_state restores besides weights, optimizer and RNG."""

    step: int
    """Optimizer steps taken."""
    data_position: int
    """How far the loop had read its data (the loop decides the unit: steps, groups)."""


class TrainerBackend(Protocol):
    """Tinker's primitives. Calls are synchronous; loops run them off the event loop."""

    step: int
    """Optimizer steps taken."""

    def forward(self, data: Sequence[Datum]) -> list[tuple[float, ...]]:
        """Per datum, the logprob of each target token; no gradient."""
        ...

    def forward_backward(self, data: Sequence[Datum], loss_fn: str,
                         loss_fn_config: LossConfig | Mapping[str, Any] | None = None,
                         ) -> ForwardBackwardOutput:
        """Compute `loss_fn` on the batch and accumulate its gradient."""
        ...

    def optim_step(self, adam: AdamParams) -> OptimStepOutput:
        """Apply the accumulated gradient and clear it."""
        ...

    def save_state(self, path: Path, data_position: int = 0) -> None:
        """Weights, optimizer, step, RNG and data position, enough to resume exactly."""
        ...

    def load_state(self, path: Path, optimizer: bool = True) -> TrainingState:
        """Restore what save_state wrote; with `optimizer=False` only the weights (the
        optimizer starts afresh and the step count is kept)."""
        ...

    def save_weights_for_sampler(self, version: int) -> WeightUpdate:
        """The current weights as an update the inference servers apply."""
        ...

    def export(self, target: Path) -> None:
        """Beyond Tinker: a model folder the inference server loads (adapters merged)."""
        ...

    def close(self) -> None:
        """Release shared memory and files."""
        ...
