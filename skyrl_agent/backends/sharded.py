"""A backend whose model lives in rank processes: the driver every sharded backend shares.

The driver starts one process per rank (`ranks.RankGroup`; on Ray, one actor per rank), splits
every batch over the data-parallel groups by tokens, and merges what they return into the
outputs the one-process backend gives. Ranks of one data-parallel group (the tensor-parallel
ranks of one model copy) get the same rows and return the same results: the driver reads the
group's first rank. Within a rank, rows go through micro-batches as in `TorchBackend`; a group
with fewer micro-batches than its peers runs stand-ins (zero loss), since each forward and
backward takes every rank.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from skyrl_agent.backends.backend import (
    AdamParams,
    Datum,
    ForwardBackwardOutput,
    OptimStepOutput,
    TrainingState,
)
from skyrl_agent.backends.loss import LossConfig
from skyrl_agent.backends.passes import checked_call, merge_passes, micro_batches, split_by_tokens
from skyrl_agent.backends.ranks import RankGroup, StartRanks
from skyrl_agent.model.weights.transport import WeightUpdate


class ShardedBackend:
    """A TrainerBackend over rank processes serving `engine` (a TorchBackend subclass)."""

    def __init__(self, engine: str, *, data_parallel: int, model_parallel: int, device: str,
                 micro_batch_tokens: int, settings: dict[str, Any],
                 ranks: StartRanks | None = None) -> None:
        self.data_parallel = data_parallel
        self.model_parallel = model_parallel
        self.micro_batch_tokens = micro_batch_tokens
        self.step = 0
        start = ranks or RankGroup  # rank processes of this one, unless told otherwise (Ray)
        self._ranks = start(data_parallel * model_parallel, engine, device,
                            {**settings, "micro_batch_tokens": micro_batch_tokens})

    # ---- Tinker primitives -----------------------------------------------------------------

    def forward(self, data: Sequence[Datum]) -> list[tuple[float, ...]]:
        if not data:
            return []
        out: dict[int, tuple[float, ...]] = {}
        for rows in self._each_group("forward_rows", [(data, plan)
                                                      for plan in self._plans(data)]):
            out.update(rows)
        return [out[i] for i in range(len(data))]

    def forward_backward(self, data: Sequence[Datum], loss_fn: str,
                         loss_fn_config: LossConfig | Mapping[str, Any] | None = None,
                         ) -> ForwardBackwardOutput:
        config = checked_call(data, loss_fn, loss_fn_config)
        passes = self._each_group("partial_pass", [(data, loss_fn, config, plan)
                                                   for plan in self._plans(data)])
        return merge_passes(data, passes)

    def optim_step(self, adam: AdamParams) -> OptimStepOutput:
        out: OptimStepOutput = self._ranks.call("optim_step", adam)[0]
        self.step = out.step
        return out

    def save_state(self, path: Path, data_position: int = 0) -> None:
        self._ranks.call("save_state", Path(path), data_position)

    def load_state(self, path: Path, optimizer: bool = True) -> TrainingState:
        state: TrainingState = self._ranks.call("load_state", Path(path), optimizer)[0]
        self.step = state.step
        return state

    def save_weights_for_sampler(self, version: int) -> WeightUpdate:
        update: WeightUpdate = self._ranks.call("gather_for_sampler", version)[0]
        return update

    def export(self, target: Path) -> None:
        self._ranks.call("export", Path(target))

    def close(self) -> None:
        """Stop the ranks (each removes its shared-memory file)."""
        self._ranks.close()

    # ---- beyond Tinker -----------------------------------------------------------------------

    def full_tensors(self, kind: str = "params") -> dict[str, torch.Tensor]:
        """Every trainable parameter (`params`) or its gradient (`grads`), gathered whole, by
        the Hugging Face model's names."""
        tensors: dict[str, torch.Tensor] = self._ranks.call("full_tensors", kind)[0]
        return tensors

    def _each_group(self, method: str, args: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Data-parallel group g runs `method(*args[g])`; each group's first rank's result."""
        per_rank = [args[rank // self.model_parallel] for rank in range(self._ranks.world_size)]
        return self._ranks.call_each(method, per_rank)[:: self.model_parallel]

    def _plans(self, data: Sequence[Datum]) -> list[list[list[int]]]:
        """Per data-parallel group, its micro-batches of row indices; all get as many."""
        plans = [micro_batches(data, rows, self.micro_batch_tokens)
                 for rows in split_by_tokens(data, self.data_parallel)]
        longest = max(len(plan) for plan in plans)
        return [plan + [[] for _ in range(longest - len(plan))] for plan in plans]
