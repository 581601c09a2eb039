"""Base models the server offers and the training models clients create on them.

A base model is a local Hugging Face folder under a name (`tinker-serve --model NAME=FOLDER`, or
a built-in name / folder that names itself). Each training model is its own torch backend (its
own weights, adapters, optimizer and order of requests), so models never see each other's
state; what they share is one worker thread, because two backward passes at once on the same
cores only slow each other down.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skyrl_agent.errors import ConfigError
from skyrl_agent.inference.models import resolve_model
from skyrl_agent.tinker.errors import TinkerUserError
from skyrl_agent.tinker.ordering import SeqOrder
from skyrl_agent.tinker.store import ModelSpec
from skyrl_agent.trainers.backend import TrainerBackend

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
UNEMBED = ("lm_head",)


@dataclass(frozen=True)
class BaseInfo:
    """One base model: its name for clients and the folder it loads from."""

    name: str
    folder: Path
    tied_embeddings: bool
    """The output layer is the embedding table (no separate unembedding to adapt)."""
    arch: str
    max_context: int | None


class BaseModels:
    """The server's base models by name."""

    def __init__(self, specs: list[str]) -> None:
        if not specs:
            raise ConfigError("tinker-serve needs at least one --model")
        self.models: dict[str, BaseInfo] = {}
        for spec in specs:
            name, _, source = spec.partition("=") if "=" in spec else (spec, "", spec)
            if not name or not source:
                raise ConfigError(f"--model {spec!r}: give NAME=FOLDER, a folder or a built-in")
            if name in self.models:
                raise ConfigError(f"--model {name!r} given twice")
            folder = resolve_model(source)
            config = json.loads((folder / "config.json").read_text())
            self.models[name] = BaseInfo(
                name, folder, bool(config.get("tie_word_embeddings", False)),
                str(config.get("model_type", "unknown")), config.get("max_position_embeddings"))

    def get(self, name: str | None) -> BaseInfo:
        if name in self.models:
            return self.models[name]
        raise TinkerUserError(f"unknown base model {name!r}; this server has "
                              f"{', '.join(sorted(self.models))}")


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
    order: SeqOrder = field(default_factory=SeqOrder)
    seen: dict[int, str] = field(default_factory=dict)
    """seq_id -> request id: a request the client sent again gets the first one's future."""
    saves: int = 0
    """Sampler-weight versions handed out so far."""


def make_backend(base: BaseInfo, spec: ModelSpec, seed: int | None,
                 micro_batch_tokens: int) -> Any:
    """A torch backend for `spec` (heavy imports here, on the worker thread)."""
    from skyrl_agent.trainers.torch_backend import TorchBackend
    from skyrl_agent.trainers.torch_model import LoraSettings

    lora = None if spec.lora_rank is None else LoraSettings(
        rank=spec.lora_rank, alpha=spec.lora_alpha, target_modules=spec.target_modules)
    return TorchBackend(base.folder, lora=lora, seed=seed or 0,
                        micro_batch_tokens=micro_batch_tokens)
