"""Per-tenant quotas: how much of the server one tenant's training models may hold.

Tenants share one process (its memory and its worker thread), so a tenant that could create any
number of models of any LoRA rank could take the memory every other tenant trains in. Each new
training model is admitted against its tenant's quota before anything is loaded, on the worker
thread that loads models (so two requests cannot both pass on the same headroom): a LoRA rank
at most `max_lora_rank`, at most `max_models` live training models, and at most
`max_memory_gb` of trained state in them, estimated from the base model's weight shapes. A
model leaves the count when its session finishes (`ServiceClient.close()`).
"""

from __future__ import annotations

import functools
import json
import struct
from pathlib import Path

from skyrl_agent.tinker.config import BaseInfo, TenantQuota
from skyrl_agent.tinker.errors import TinkerUserError
from skyrl_agent.tinker.store import ModelSpec

BYTES_PER_TRAINED_PARAMETER = 16
"""A parameter the optimizer updates holds its value, its gradient and Adam's two moments
(float32 each): what a model costs beyond the shared base, activations aside."""
GIB = 1 << 30


def trained_bytes(base: BaseInfo, spec: ModelSpec) -> int:
    """The estimated memory of a model's trained state: every parameter for full fine-tuning;
    for LoRA, rank x (in + out) per adapted weight matrix (a fused expert tensor counts once per
    expert)."""
    shapes = _weight_shapes(base.folder)
    if spec.lora_rank is None:
        total = sum(_count(shape) for shape in shapes.values())
    else:
        total = 0
        for name, shape in shapes.items():
            module = name.removesuffix(".weight")
            if len(shape) >= 2 and module.rsplit(".", 1)[-1] in spec.target_modules:
                total += spec.lora_rank * (shape[-1] + shape[-2]) * _count(shape[:-2])
    return total * BYTES_PER_TRAINED_PARAMETER


def admit(quota: TenantQuota, tenant: str, spec: ModelSpec, cost: int, held: list[int]) -> None:
    """TinkerUserError (one line) unless `tenant`, holding models of `held` bytes, may add a
    model of `spec` costing `cost` bytes."""
    if spec.lora_rank is not None and spec.lora_rank > quota.max_lora_rank:
        raise TinkerUserError(
            f"LoRA rank {spec.lora_rank} is above this server's limit of "
            f"{quota.max_lora_rank} (tinker-serve --max-lora-rank)"
        )
    if len(held) >= quota.max_models:
        raise TinkerUserError(
            f"tenant {tenant!r} already has {len(held)} training models, its "
            f"quota (tinker-serve --max-models); close a ServiceClient first"
        )
    if sum(held) + cost > quota.max_memory_gb * GIB:
        raise TinkerUserError(
            f"this model would hold ~{cost / GIB:.2f} GiB of trained state; "
            f"tenant {tenant!r} holds {sum(held) / GIB:.2f} of its "
            f"{quota.max_memory_gb:g} GiB quota (tinker-serve "
            "--tenant-memory-gb)"
        )


def _count(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


@functools.cache
def _weight_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape in the base model's safetensors files, from their headers alone
    (the server's own model files, not client input)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        shapes |= {
            name: tuple(entry["shape"]) for name, entry in header.items() if name != "__metadata__"
        }
    return shapes
