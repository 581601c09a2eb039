"""The FSDP2 backend: Tinker's primitives over a Hugging Face model sharded across N ranks.

The backend itself is a driver: it starts one process per rank (`ranks.RankGroup`; each runs
`fsdp_rank.FsdpRank`), splits every batch over them by tokens, and merges what they return into
the same outputs the one-process backend gives. Within a rank, rows go through micro-batches as
in `TorchBackend`; a rank with fewer micro-batches than its peers runs stand-ins (zero loss), since
each forward and backward gathers weights from every rank.

`device` picks the transport: CPU ranks talk over gloo, GPU ranks over NCCL (one GPU each).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from skyrl_agent.trainers.backend import (
    AdamParams,
    Datum,
    ForwardBackwardOutput,
    OptimStepOutput,
    TrainingState,
    WeightUpdate,
)
from skyrl_agent.trainers.loss import LossConfig
from skyrl_agent.trainers.passes import checked_call, merge_passes, micro_batches, split_by_tokens
from skyrl_agent.trainers.ranks import RankGroup
from skyrl_agent.trainers.torch_model import LoraSettings, pick_device


class FsdpBackend:
    """A TrainerBackend over `world_size` FSDP2 ranks of the model in `model_folder`."""

    def __init__(self, model_folder: Path, *, world_size: int = 2,
                 lora: LoraSettings | None = None, device: str | None = None,
                 dtype: str = "auto", micro_batch_tokens: int = 2048, seed: int = 0) -> None:
        self.model_folder = Path(model_folder)
        self.lora = lora
        self.world_size = world_size
        self.micro_batch_tokens = micro_batch_tokens
        self.step = 0
        kind = pick_device(device).type
        if kind == "cuda" and torch.cuda.device_count() < world_size:
            raise ValueError(f"{world_size} FSDP ranks need {world_size} GPUs, "
                             f"{torch.cuda.device_count()} visible")
        self._ranks = RankGroup(world_size, "skyrl_agent.trainers.fsdp_rank:FsdpRank", kind, {
            "model_folder": str(self.model_folder), "lora": lora, "dtype": dtype,
            "micro_batch_tokens": micro_batch_tokens, "seed": seed})

    # ---- Tinker primitives -----------------------------------------------------------------

    def forward(self, data: Sequence[Datum]) -> list[tuple[float, ...]]:
        if not data:
            return []
        out: dict[int, tuple[float, ...]] = {}
        for rows in self._ranks.call_each("forward_rows", [(data, plan)
                                                           for plan in self._plans(data)]):
            out.update(rows)
        return [out[i] for i in range(len(data))]

    def forward_backward(self, data: Sequence[Datum], loss_fn: str,
                         loss_fn_config: LossConfig | Mapping[str, Any] | None = None,
                         ) -> ForwardBackwardOutput:
        config = checked_call(data, loss_fn, loss_fn_config)
        passes = self._ranks.call_each("partial_pass", [(data, loss_fn, config, plan)
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
        """Every trainable parameter (`params`) or its gradient (`grads`), gathered whole."""
        tensors: dict[str, torch.Tensor] = self._ranks.call("full_tensors", kind)[0]
        return tensors

    def _plans(self, data: Sequence[Datum]) -> list[list[list[int]]]:
        """Per rank, its micro-batches of row indices; all ranks get as many (empty ones run a
        stand-in)."""
        plans = [micro_batches(data, rows, self.micro_batch_tokens)
                 for rows in split_by_tokens(data, self.world_size)]
        longest = max(len(plan) for plan in plans)
        return [plan + [[] for _ in range(longest - len(plan))] for plan in plans]
