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
from skyrl_agent.inference.models import resolve_model
from skyrl_agent.tinker.errors import TinkerUserError


@dataclass(frozen=True)
class ServiceOptions:
    data_dir: Path
    """Checkpoints and sampling sessions (survive a restart)."""
    models: tuple[str, ...]
    """Base models: NAME=FOLDER, a folder, or a built-in name."""
    micro_batch_tokens: int = 2048
    max_batch_size: int = 32
    """Sequences each sampler decodes together."""
    poll_s: float = 30.0
    """How long retrieve_future holds a request open before answering try_again."""


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
            self.models[name] = BaseInfo(
                name, folder, bool(config.get("tie_word_embeddings", False)),
                str(config.get("model_type", "unknown")), config.get("max_position_embeddings"),
                int(config["vocab_size"]))

    def get(self, name: str | None) -> BaseInfo:
        if name in self.models:
            return self.models[name]
        raise TinkerUserError(f"unknown base model {name!r}; this server has "
                              f"{', '.join(sorted(self.models))}")


