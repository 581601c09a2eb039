"""The Megatron backend's driver: `tp x dp` rank processes, each a `MegatronRank`.

Ranks 0..tp-1 hold one copy of the model split tensor-parallel, the next tp ranks the next copy,
and so on; batches are split over the copies by tokens (`sharded.ShardedBackend`). CPU ranks
talk over gloo, GPU ranks over NCCL. A GPU performance mode (Transformer Engine layers,
Megatron's distributed optimizer, bf16) would be another layer spec and optimizer behind the same
rank interface; it needs a GPU machine to be written and tested.
"""

from __future__ import annotations

from pathlib import Path

import torch

from skyrl_agent.backends.ranks import StartRanks
from skyrl_agent.backends.sharded import ShardedBackend
from skyrl_agent.model.loading import LoraSettings, pick_device


def check_parallelism(model_folder: Path, tensor_parallel: int,
                      expert_parallel: int = 1) -> str | None:
    """Why the model in `model_folder` cannot be split `tensor_parallel` ways (its experts
    `expert_parallel` ways), or None (reads only its config)."""
    from transformers import AutoConfig

    from skyrl_agent.backends.megatron.mapping import unsupported

    return unsupported(AutoConfig.from_pretrained(model_folder), tensor_parallel,
                       expert_parallel)


class MegatronBackend(ShardedBackend):
    """A TrainerBackend over `data_parallel` copies of a GPTModel, each split over
    `tensor_parallel` ranks; an MoE model's experts are split over `expert_parallel` of the
    copies (tokens travel to their experts' rank and back by all-to-all)."""

    def __init__(self, model_folder: Path, *, tensor_parallel: int = 2, data_parallel: int = 1,
                 expert_parallel: int = 1, lora: LoraSettings | None = None,
                 device: str | None = None, dtype: str = "auto", micro_batch_tokens: int = 2048,
                 seed: int = 0, ranks: StartRanks | None = None,
                 routing_replay: bool = False) -> None:
        self.model_folder = Path(model_folder)
        if lora is not None:
            raise ValueError("LoRA is not available with trainer.backend=megatron yet; use "
                             "trainer.backend=fsdp or torch for LoRA")
        if data_parallel % expert_parallel:
            raise ValueError(f"expert_parallel={expert_parallel} must divide "
                             f"data_parallel={data_parallel} (experts are split over copies)")
        problem = check_parallelism(self.model_folder, tensor_parallel, expert_parallel)
        if problem:
            raise ValueError(problem)
        kind = pick_device(device).type
        count = tensor_parallel * data_parallel
        if kind == "cuda" and ranks is None and torch.cuda.device_count() < count:
            raise ValueError(f"{count} Megatron ranks need {count} GPUs, "
                             f"{torch.cuda.device_count()} visible")
        super().__init__("skyrl_agent.backends.megatron.rank:MegatronRank",
                         data_parallel=data_parallel, model_parallel=tensor_parallel,
                         device=kind, micro_batch_tokens=micro_batch_tokens,
                         settings={"model_folder": str(self.model_folder), "tp": tensor_parallel,
                                   "ep": expert_parallel, "routing_replay": routing_replay,
                                   "lora": None, "dtype": dtype, "seed": seed}, ranks=ranks)
