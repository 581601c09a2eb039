"""From the run config's `trainer` section to a backend and its optimizer settings. Loops,
`sft`, `train` and the Tinker server all build their backends here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from skyrl_agent.backends.backend import AdamParams, TrainerBackend
from skyrl_agent.backends.ranks import StartRanks
from skyrl_agent.config import RunConfig, TrainerConfig
from skyrl_agent.errors import ConfigError
from skyrl_agent.model.loading import LoraSettings
from skyrl_agent.model.vision import is_vision_model


def adam_params(trainer: TrainerConfig, learning_rate: float | None = None) -> AdamParams:
    return AdamParams(learning_rate=learning_rate or trainer.learning_rate,
                      weight_decay=trainer.weight_decay, grad_clip_norm=trainer.grad_clip_norm)


def make_backend(config: RunConfig, model: str | None = None,
                 ranks: StartRanks | None = None) -> TrainerBackend:
    """The configured backend over `model` (default: the model the inference server serves);
    a sharded backend's ranks started by `ranks` (default: processes of this one)."""
    from skyrl_agent.model.names import resolve_model

    return build_backend(resolve_model(model or config.inference.model), config.trainer,
                         lora_settings(config.trainer), config.seed, ranks)


def lora_settings(trainer: TrainerConfig) -> LoraSettings | None:
    """The LoRA adapters `trainer` asks for; None for a full fine-tune."""
    return LoraSettings(rank=trainer.lora_rank, alpha=trainer.lora_alpha) \
        if trainer.lora_rank else None


def build_backend(folder: Path, trainer: TrainerConfig, lora: LoraSettings | None,
                  seed: int, ranks: StartRanks | None = None,
                  frozen_base: Any = None) -> TrainerBackend:
    """`trainer.backend` over the model in `folder`; `frozen_base` (torch, LoRA): a loaded base
    whose weights the new model shares instead of loading its own."""
    if trainer.backend == "megatron" and is_vision_model(folder):
        raise ConfigError(f"{folder.name} is a vision-language model; it trains on the torch "
                          "or fsdp backend, not megatron yet")
    if trainer.backend == "megatron":
        from skyrl_agent.backends.megatron.backend import MegatronBackend

        return MegatronBackend(folder, tensor_parallel=trainer.tensor_parallel,
                               data_parallel=trainer.data_parallel,
                               expert_parallel=trainer.expert_parallel, lora=lora,
                               dtype=trainer.dtype,
                               micro_batch_tokens=trainer.micro_batch_tokens, seed=seed,
                               ranks=ranks, routing_replay=trainer.routing_replay)
    if trainer.backend == "fsdp":
        from skyrl_agent.backends.fsdp_backend import FsdpBackend

        return FsdpBackend(folder, world_size=trainer.data_parallel, lora=lora,
                           dtype=trainer.dtype, micro_batch_tokens=trainer.micro_batch_tokens,
                           seed=seed, ranks=ranks, routing_replay=trainer.routing_replay)
    from skyrl_agent.backends.torch_backend import TorchBackend

    return TorchBackend(folder, lora=lora, dtype=trainer.dtype,
                        micro_batch_tokens=trainer.micro_batch_tokens, seed=seed,
                        routing_replay=trainer.routing_replay, frozen_base=frozen_base)


def describe_backend(trainer: TrainerConfig) -> str:
    """The backend in a few words, for plans."""
    if trainer.backend == "megatron":
        experts = (f", experts split {trainer.expert_parallel} ways"
                   if trainer.expert_parallel > 1 else "")
        return (f"Megatron over {trainer.tensor_parallel * trainer.data_parallel} rank "
                f"processes (tensor parallel {trainer.tensor_parallel} x data parallel "
                f"{trainer.data_parallel}{experts})")
    if trainer.backend == "fsdp":
        return f"FSDP2 over {trainer.data_parallel} rank processes"
    return "torch in one process"
