"""Weight updates from a safetensors file the trainer wrote (ideally on /dev/shm).

The file is checked in full before the first parameter changes, so a bad file leaves the model
as it was: every name must exist in the model and every shape must match. A file may hold a
subset of the parameters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file


class WeightUpdateError(ValueError):
    """The file is missing, unreadable, or does not fit the served model."""


def load_weights(model: Any, path: str | Path) -> int:
    """Copy the tensors in `path` into `model` in place; returns how many were copied."""
    path = Path(path)
    if not path.is_file():
        raise WeightUpdateError(f"weights file not found: {path}")
    try:
        tensors = load_file(path)
    except (SafetensorError, OSError) as exc:
        raise WeightUpdateError(f"cannot read {path} as safetensors: {exc}") from None
    params = model.state_dict(keep_vars=True)
    unknown = sorted(set(tensors) - set(params))
    if unknown:
        raise WeightUpdateError(f"{path.name}: {len(unknown)} names not in the model, "
                                f"e.g. {unknown[0]!r}")
    for name, tensor in tensors.items():
        if tensor.shape != params[name].shape:
            raise WeightUpdateError(f"{path.name}: {name} has shape {tuple(tensor.shape)}, "
                                    f"the model's is {tuple(params[name].shape)}")
    with torch.no_grad():
        for name, tensor in tensors.items():
            params[name].copy_(tensor)
    return len(tensors)
