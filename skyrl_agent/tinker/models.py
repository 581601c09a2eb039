"""The training models clients create on the server's base models.

Each training model is its own torch backend (its
own weights, adapters, optimizer and order of requests), so models never see each other's
state; what they share is one worker thread, because two backward passes at once on the same
cores only slow each other down.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from skyrl_agent.backends.backend import TrainerBackend
from skyrl_agent.tinker.config import BaseInfo, ServiceOptions
from skyrl_agent.tinker.errors import TinkerUserError
from skyrl_agent.tinker.ordering import SeqOrder
from skyrl_agent.tinker.store import ModelSpec

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
UNEMBED = ("lm_head",)


def lora_spec(base: BaseInfo, rank: int, train_mlp: bool = True, train_attn: bool = True,
              train_unembed: bool = True) -> ModelSpec:
    """Tinker's LoRA config as a ModelSpec. With tied embeddings the unembedding is the
    embedding table, and an adapter on it would change the model's inputs too: left out."""
    if rank < 1:
        raise TinkerUserError(f"LoRA rank must be >= 1, got {rank}")
    targets = (ATTENTION if train_attn else ()) + (MLP if train_mlp else ())
    if train_unembed and not base.tied_embeddings:
        targets += UNEMBED
    if not targets:
        raise TinkerUserError("LoRA needs at least one of train_mlp, train_attn, train_unembed "
                              "(train_unembed alone does not apply: this model ties embeddings)")
    return ModelSpec(base_model=base.name, lora_rank=rank, target_modules=targets)


@dataclass
class TrainingModel:
    """A client's training model."""

    model_id: str
    spec: ModelSpec
    base: BaseInfo
    backend: TrainerBackend
    owner: str
    """The tenant whose session created it: the only one that may use it."""
    order: SeqOrder = field(default_factory=SeqOrder)
    seen: dict[int, str] = field(default_factory=dict)
    """seq_id -> request id: a request the client sent again gets the first one's future."""
    saves: int = 0
    """Sampler-weight versions handed out so far."""
    memory: int = 0
    """Estimated bytes of trained state, counted against its owner's quota (quotas.py)."""


def make_backend(base: BaseInfo, spec: ModelSpec, seed: int | None,
                 options: ServiceOptions, frozen: dict[str, Any]) -> Any:
    """The server's backend for `spec` (heavy imports here, on the worker thread). LoRA models
    on the torch backend share their base model's weights, loaded once into `frozen` (base
    name -> model): memory is one base plus an adapter per training model."""
    from skyrl_agent.backends.build import build_backend
    from skyrl_agent.config import TrainerConfig
    from skyrl_agent.model.loading import LoraSettings

    lora = None if spec.lora_rank is None else LoraSettings(
        rank=spec.lora_rank, alpha=spec.lora_alpha, target_modules=spec.target_modules)
    trainer = TrainerConfig.model_validate({
        "backend": options.backend, "data_parallel": options.data_parallel,
        "tensor_parallel": options.tensor_parallel,
        "micro_batch_tokens": options.micro_batch_tokens})
    if lora is None or options.backend != "torch":
        return build_backend(base.folder, trainer, lora, seed or 0)
    if base.name not in frozen:
        from skyrl_agent.model.loading import load_causal_lm, pick_device, pick_dtype

        device = pick_device(None)
        frozen[base.name] = load_causal_lm(base.folder, pick_dtype(trainer.dtype, device),
                                           device, None)
    return build_backend(base.folder, trainer, lora, seed or 0, frozen_base=frozen[base.name])
