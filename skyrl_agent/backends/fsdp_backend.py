"""The FSDP2 backend: Tinker's primitives over a Hugging Face model sharded across N ranks.

Each rank (`fsdp_rank.FsdpRank`) holds 1/N of every parameter, gradient and optimizer moment
and trains on its share of each batch, split by tokens (`sharded.ShardedBackend`). `device`
picks the transport: CPU ranks talk over gloo, GPU ranks over NCCL (one GPU each).
"""

from __future__ import annotations

from pathlib import Path

import torch

from skyrl_agent.backends.ranks import StartRanks
from skyrl_agent.backends.sharded import ShardedBackend
from skyrl_agent.model.loading import LoraSettings, pick_device


class FsdpBackend(ShardedBackend):
    """A TrainerBackend over `world_size` FSDP2 ranks of the model in `model_folder`."""

    def __init__(self, model_folder: Path, *, world_size: int = 2,
                 lora: LoraSettings | None = None, device: str | None = None,
                 dtype: str = "auto", micro_batch_tokens: int = 2048, seed: int = 0,
                 ranks: StartRanks | None = None, routing_replay: bool = False) -> None:
        self.model_folder = Path(model_folder)
        self.lora = lora
        kind = pick_device(device).type
        if kind == "cuda" and ranks is None and torch.cuda.device_count() < world_size:
            raise ValueError(f"{world_size} FSDP ranks need {world_size} GPUs, "
                             f"{torch.cuda.device_count()} visible")
        super().__init__("skyrl_agent.backends.fsdp_rank:FsdpRank", data_parallel=world_size,
                         model_parallel=1, device=kind, micro_batch_tokens=micro_batch_tokens,
                         settings={"model_folder": str(self.model_folder), "lora": lora,
                                   "dtype": dtype, "seed": seed,
                                   "routing_replay": routing_replay}, ranks=ranks)
