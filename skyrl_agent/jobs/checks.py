"""What a training run refuses before anything starts: combinations of the config that the loop,
the backend or the inference engine cannot use, each with one line."""

from __future__ import annotations

from skyrl_agent.config import RunConfig
from skyrl_agent.errors import ConfigError

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

    from skyrl_agent.model.names import resolve_model

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

    from skyrl_agent.model.names import resolve_model

    if importlib.util.find_spec("megatron.core") is None:
        raise ConfigError("trainer.backend=megatron needs megatron-core: "
                          "pip install 'skyrl-agent[megatron]'")
    if config.trainer.lora_rank:
        raise ConfigError("trainer.backend=megatron has no LoRA yet: use trainer.backend=fsdp "
                          "or torch with trainer.lora_rank")
    from skyrl_agent.backends.megatron.backend import check_parallelism

    problem = check_parallelism(resolve_model(config.inference.model),
                                config.trainer.tensor_parallel, config.trainer.expert_parallel)
    if problem:
        raise ConfigError(problem)
