"""What the server keeps on disk, under its data dir, so that it survives a restart.

    DATA/runs/RUN/weights/NAME/          training state (backend.save_state) + spec.json
    DATA/runs/RUN/sampler_weights/NAME/  weights.safetensors (what the sampler serves) + spec.json
    DATA/sampling_sessions/ID.json       which base model and weights a sampling session uses

`tinker://RUN/weights/NAME` and `tinker://RUN/sampler_weights/NAME` name the first two (RUN is
the training model's id). Every name coming from a client is checked against a strict pattern
before it touches a path, so `..`, slashes and hidden names never reach the file system.
Ephemeral sampler weights (save_weights_and_get_sampling_client) live beside the named ones
as `.ephemeral-N` and only the newest few per run are kept.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from skyrl_agent.atomic import atomic_write_text
from skyrl_agent.tinker.errors import TinkerNotFound, TinkerUserError

Kind = Literal["weights", "sampler_weights"]
# Used with fullmatch only: `$` would also match before a trailing newline.
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}")
"""Training run, session and sampling session ids."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
KEEP_EPHEMERAL = 4
"""Ephemeral sampler weights kept per run; older sampling sessions on them stop working."""


class ModelSpec(BaseModel):
    """What a checkpoint needs to be loaded again: the base model and the LoRA shape."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_model: str
    """The name the client asked for (an alias of `tinker-serve --model`)."""
    lora_rank: int | None = None
    """None: full fine-tuning."""
    lora_alpha: int = 32
    target_modules: tuple[str, ...] = ()
    """Linear layers with adapters (by name suffix)."""


class SamplerRef(BaseModel):
    """A sampling session: the base model, and the weights file it serves (None: the base)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_model: str
    weights: str | None = None
    """Absolute path of a sampler weights file inside the data dir."""
    model_path: str | None = None
    """The tinker:// path the session was created from, if any."""
    owner: str = "default"
    """The tenant that created it: the only one that may sample through it."""


@dataclass(frozen=True)
class Checkpoint:
    """A resolved tinker:// path."""

    path: Path
    """The checkpoint's folder."""
    tinker_path: str
    spec: ModelSpec
    run: str
    """The training run (model id) that saved it."""


class Store:
    """Checkpoints and sampling sessions under one data dir."""

    def __init__(self, data_dir: Path) -> None:
        self.root = Path(data_dir)
        (self.root / "runs").mkdir(parents=True, exist_ok=True)
        (self.root / "sampling_sessions").mkdir(parents=True, exist_ok=True)

    # ---- checkpoints ------------------------------------------------------------------------

    def new_checkpoint(self, run: str, kind: Kind, name: str, overwrite: bool = True,
                       ) -> tuple[Path, str]:
        """The folder to write a checkpoint into, and its tinker:// path."""
        check_name(RUN_ID, run, "training run id")
        check_name(_NAME, name, "checkpoint name")
        folder = self.root / "runs" / run / kind / name
        if folder.exists() and not overwrite:
            raise TinkerUserError(f"checkpoint {name!r} already exists for {run} "
                                  "(save with overwrite=True to replace it)")
        return folder, f"tinker://{run}/{kind}/{name}"

    def ephemeral_sampler(self, run: str) -> Path:
        """A fresh folder for ephemeral sampler weights; prunes the oldest beyond the limit."""
        check_name(RUN_ID, run, "training run id")
        parent = self.root / "runs" / run / "sampler_weights"
        parent.mkdir(parents=True, exist_ok=True)
        existing = sorted((p for p in parent.glob(".ephemeral-*") if p.name[11:].isdigit()),
                          key=lambda p: int(p.name[11:]))
        number = int(existing[-1].name[11:]) + 1 if existing else 0
        for old in existing[: max(len(existing) - KEEP_EPHEMERAL + 1, 0)]:
            shutil.rmtree(old, ignore_errors=True)
        return parent / f".ephemeral-{number}"

    def resolve(self, tinker_path: str, kind: Kind) -> Checkpoint:
        """The checkpoint a tinker:// path names, which must be of `kind`; a clear error when
        it is not one of ours."""
        checkpoint = self.find(tinker_path)
        if checkpoint.path.parent.name != kind:
            wanted = "a training state (…/weights/…)" if kind == "weights" else \
                "sampler weights (…/sampler_weights/…)"
            raise TinkerUserError(f"{tinker_path} is not {wanted}")
        return checkpoint

    def find(self, tinker_path: str) -> Checkpoint:
        """The checkpoint a tinker:// path names, of either kind."""
        if not isinstance(tinker_path, str) or not tinker_path.startswith("tinker://"):
            raise TinkerUserError(f"not a tinker:// path: {tinker_path!r}")
        parts = tinker_path.removeprefix("tinker://").split("/")
        if len(parts) != 3 or parts[1] not in ("weights", "sampler_weights"):
            raise TinkerUserError(f"malformed tinker path {tinker_path!r}: expected "
                                  "tinker://RUN/weights/NAME or tinker://RUN/sampler_weights/NAME")
        run, kind, name = parts
        check_name(RUN_ID, run, "training run id")
        check_name(_NAME, name, "checkpoint name")
        folder = self.root / "runs" / run / kind / name
        spec_file = folder / "spec.json"
        if not spec_file.is_file():
            raise TinkerNotFound(f"no checkpoint at {tinker_path} on this server")
        return Checkpoint(folder, tinker_path, read_spec(folder), run)

    # ---- sampling sessions ------------------------------------------------------------------

    def save_session(self, session_id: str, ref: SamplerRef) -> None:
        check_name(RUN_ID, session_id, "sampling session id")
        atomic_write_text(self.root / "sampling_sessions" / f"{session_id}.json",
                          ref.model_dump_json())

    def load_session(self, session_id: str) -> SamplerRef | None:
        if not isinstance(session_id, str) or not RUN_ID.fullmatch(session_id):
            return None
        path = self.root / "sampling_sessions" / f"{session_id}.json"
        try:
            return SamplerRef.model_validate_json(path.read_text())
        except (OSError, ValidationError):
            return None


def write_spec(folder: Path, spec: ModelSpec) -> None:
    atomic_write_text(folder / "spec.json", spec.model_dump_json())


def read_spec(folder: Path) -> ModelSpec:
    try:
        return ModelSpec.model_validate_json((folder / "spec.json").read_text())
    except (OSError, ValidationError) as exc:
        raise TinkerUserError(f"checkpoint {folder.name} is unreadable: {exc}") from None


def check_name(pattern: re.Pattern[str], value: object, what: str) -> str:
    """`value`, if it is a name `pattern` allows (never a path: no slash, no `..`)."""
    if not isinstance(value, str) or not pattern.fullmatch(value) or ".." in value:
        raise TinkerUserError(f"invalid {what} {value!r}: letters, digits, '.', '_', '-' "
                              "(and ':' in run ids) only")
    return value
