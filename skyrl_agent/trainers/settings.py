"""From the run config's `trainer` section to what a backend takes: the backend itself, the
loss config and the optimizer settings. Loops, `sft` and `train` all build them here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from skyrl_agent.config import RunConfig, TrainerConfig
from skyrl_agent.errors import ConfigError
from skyrl_agent.inference.vision import is_vision_model
from skyrl_agent.trainers.backend import AdamParams, TrainerBackend
from skyrl_agent.trainers.loss import LossConfig
from skyrl_agent.trainers.ranks import StartRanks
from skyrl_agent.trainers.torch_model import LoraSettings

GROUP_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce_pp")
"""Advantage estimators that compare samples of one task: they need groups of 2 or more."""


def check_trainable(config: RunConfig) -> None:
    """Reject combinations a training run cannot use, with one line."""
    n = config.collector.n_samples_per_task
    if config.trainer.advantage in GROUP_ESTIMATORS and n < 2:
        raise ConfigError(f"trainer.advantage={config.trainer.advantage} compares the samples of "
                          f"a task: set collector.n_samples_per_task >= 2 (it is {n})")
    if config.trainer.backend == "megatron":
        check_megatron(config)
    if config.trainer.routing_replay and config.inference.engine == "vllm" \
            and not config.inference.endpoint:
        check_vllm_routing()
    if config.trainer.routing_replay or (config.trainer.backend == "fsdp"
                                         and config.trainer.lora_rank):
        check_moe(config)


def check_vllm_routing() -> None:
    """vLLM servers started here return routing only on a GPU: refused before the trainer
    loads its model (vllm_server refuses again, for servers that start without a trainer)."""
    from skyrl_agent.inference.vllm.launch import detect_device, routing_refusal

    refusal = routing_refusal(detect_device())  # the device vllm_server will pick
    if refusal:
        raise ConfigError(refusal)


def check_moe(config: RunConfig) -> None:
    """Routing replay needs an MoE model; FSDP2 has no adapters on MoE experts."""
    from transformers import AutoConfig

    from skyrl_agent.inference.models import resolve_model

    model = AutoConfig.from_pretrained(resolve_model(config.inference.model))
    experts = getattr(model, "num_experts", None) or getattr(model, "num_local_experts", None)
    if config.trainer.routing_replay and not experts:
        raise ConfigError(f"trainer.routing_replay needs a mixture-of-experts model; "
                          f"{config.inference.model} ({model.model_type}) has no experts")
    if experts and config.trainer.backend == "fsdp" and config.trainer.lora_rank:
        raise ConfigError("LoRA on an MoE model's experts needs trainer.backend=torch (the "
                          "FSDP2 backend does not gather per-expert adapters for the sampler)")


def check_megatron(config: RunConfig) -> None:
    """The Megatron backend's own limits, checked before any rank starts."""
    import importlib.util

    from skyrl_agent.inference.models import resolve_model

    if importlib.util.find_spec("megatron.core") is None:
        raise ConfigError("trainer.backend=megatron needs megatron-core: "
                          "pip install 'skyrl-agent[megatron]'")
    if config.trainer.lora_rank:
        raise ConfigError("trainer.backend=megatron has no LoRA yet: use trainer.backend=fsdp "
                          "or torch with trainer.lora_rank")
    from skyrl_agent.trainers.megatron.backend import check_parallelism

    problem = check_parallelism(resolve_model(config.inference.model),
                                config.trainer.tensor_parallel, config.trainer.expert_parallel)
    if problem:
        raise ConfigError(problem)


def loss_config(config: RunConfig) -> LossConfig:
    trainer = config.trainer
    return LossConfig(
        reduction=trainer.reduction,
        norm_len=float(config.agent.max_turns * config.inference.max_tokens),
        clip_low=trainer.clip_low, clip_high=trainer.clip_high,
        dual_clip=trainer.dual_clip if trainer.loss_fn == "ppo" else None,
        correction=trainer.correction, kl_coef=trainer.kl_coef,
        kl_estimator=trainer.kl_estimator)


def adam_params(trainer: TrainerConfig, learning_rate: float | None = None) -> AdamParams:
    return AdamParams(learning_rate=learning_rate or trainer.learning_rate,
                      weight_decay=trainer.weight_decay, grad_clip_norm=trainer.grad_clip_norm)


def make_backend(config: RunConfig, model: str | None = None,
                 ranks: StartRanks | None = None) -> TrainerBackend:
    """The configured backend over `model` (default: the model the inference server serves);
    a sharded backend's ranks started by `ranks` (default: processes of this one)."""
    from skyrl_agent.inference.models import resolve_model

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
        from skyrl_agent.trainers.megatron.backend import MegatronBackend

        return MegatronBackend(folder, tensor_parallel=trainer.tensor_parallel,
                               data_parallel=trainer.data_parallel,
                               expert_parallel=trainer.expert_parallel, lora=lora,
                               dtype=trainer.dtype,
                               micro_batch_tokens=trainer.micro_batch_tokens, seed=seed,
                               ranks=ranks, routing_replay=trainer.routing_replay)
    if trainer.backend == "fsdp":
        from skyrl_agent.trainers.fsdp_backend import FsdpBackend

        return FsdpBackend(folder, world_size=trainer.data_parallel, lora=lora,
                           dtype=trainer.dtype, micro_batch_tokens=trainer.micro_batch_tokens,
                           seed=seed, ranks=ranks, routing_replay=trainer.routing_replay)
    from skyrl_agent.trainers.torch_backend import TorchBackend

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
