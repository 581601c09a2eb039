"""What the command line sets: the base models (by the names clients use) and the options.

A base model is a local Hugging Face folder under a name (`tinker-serve --model NAME=FOLDER`,
or a built-in name or folder that names itself). Light on purpose: the CLI checks its input
with these before importing torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from skyrl_agent.errors import ConfigError
from skyrl_agent.model.names import resolve_model
from skyrl_agent.tinker.errors import TinkerUserError


@dataclass(frozen=True)
class TenantQuota:
    """What each tenant's training models may hold (quotas.py enforces it)."""

    max_lora_rank: int = 64
    max_models: int = 16
    """Live training models (each LoRA model is an adapter and its optimizer state)."""
    max_memory_gb: float = 32.0
    """Estimated trained state (parameters, gradients, Adam moments) of its live models."""


@dataclass(frozen=True)
class ServiceOptions:
    data_dir: Path
    """Checkpoints and sampling sessions (survive a restart)."""
    models: tuple[str, ...]
    """Base models: NAME=FOLDER, a folder, or a built-in name."""
    micro_batch_tokens: int = 2048
    backend: str = "torch"
    """Each training model's backend (trainer.backend's choices)."""
    data_parallel: int = 1
    tensor_parallel: int = 1
    """Ranks of a sharded backend (as trainer.data_parallel and trainer.tensor_parallel)."""
    max_batch_size: int = 32
    """Sequences each sampler decodes together (the embedded engine)."""
    engine: str = "embedded"
    """What samples: `embedded` (the project's server) or `vllm` (as inference.engine)."""
    poll_s: float = 30.0
    """How long retrieve_future holds a request open before answering try_again."""
    quota: TenantQuota = TenantQuota()
    """Per tenant: LoRA rank, live training models and their memory."""


CHUNK_BYTES = 5_000_000
"""The forward_backward chunk the server asks the SDK for (client/config; the SDK's default):
the SDK splits a batch into chunks of at most this many estimated bytes, or one datum."""
BYTES_PER_POSITION = 4 + 16 * 8
"""The most one position of a datum weighs in the SDK's estimate: its token (int32) and 16 loss
inputs (the SDK's custom-loss limit) of 8 bytes each (int64 or float64 at worst)."""
DEFAULT_CONTEXT = 32768
"""Assumed for a base model whose config names no context length."""
TINKER_KEY_PREFIX = "tml-"
"""The SDK refuses API keys that do not start with this (or are not JWTs)."""


def max_body_bytes(max_context: int) -> int:
    """The largest request body the SDK sends: a forward_backward chunk of CHUNK_BYTES, or a
    single datum of `max_context` positions when that is bigger, doubled for protobuf's framing
    (token ids are varints of up to 5 bytes, every datum and tensor has its own headers). Other
    requests (a sample's prompt of at most `max_context` ids as JSON) are far smaller."""
    return 2 * (CHUNK_BYTES + max_context * BYTES_PER_POSITION)


@dataclass(frozen=True)
class BaseInfo:
    """One base model: its name for clients and the folder it loads from."""

    name: str
    folder: Path
    tied_embeddings: bool
    """The output layer is the embedding table (no separate unembedding to adapt)."""
    arch: str
    max_context: int | None
    vocab_size: int


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
            text = config.get("text_config", config)  # a vision model nests its language model's
            self.models[name] = BaseInfo(
                name, folder, bool(config.get("tie_word_embeddings", False)),
                str(config.get("model_type", "unknown")), text.get("max_position_embeddings"),
                int(text["vocab_size"]))

    def max_context(self) -> int:
        """The longest context among the base models."""
        return max(base.max_context or DEFAULT_CONTEXT for base in self.models.values())

    def get(self, name: str | None) -> BaseInfo:
        if name in self.models:
            return self.models[name]
        raise TinkerUserError(f"unknown base model {name!r}; this server has "
                              f"{', '.join(sorted(self.models))}")


