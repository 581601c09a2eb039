"""Which sampler tensors an optimizer moved since the servers' last update, down to MoE experts.

Under AdamW an element moves in a step iff its first moment is non-zero (or weight decay acts
on it). An expert no token has reached yet has a zero gradient, hence a zero moment, and keeps
its weights exactly; so does the merged weight of an expert whose adapter rows never moved. A
server holding the last update then needs only the moved tensors and expert rows
(`types.ChangedWeights`).

With LoRA the sampler gets merged weights `W + s * B @ A`. peft's adapter of a stacked
[experts, ...] weight keeps expert e's part of A in rows e*r .. (e+1)*r and its part of B in
columns j*experts + e (its `get_delta_weight` reshapes them so): expert e's merged slice can
move only if one of those did.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from skyrl_agent.types import ChangedWeights

Moved = torch.Tensor | None
"""Per sampler tensor: a bool per expert (row) that moved, or None for the whole tensor."""


class MovedWeights:
    """The sampler tensors moved since the version the servers hold."""

    def __init__(self) -> None:
        self.published: int | None = None
        """The version of the last update the servers got (None: they need everything)."""
        self._moved: dict[str, Moved] = {}

    def forget(self) -> None:
        """Weights changed outside the optimizer (a loaded checkpoint): send everything."""
        self.published = None

    def note_step(self, optimizer: torch.optim.Optimizer, params: Mapping[str, Any],
                  adapters: Mapping[str, Any] | None) -> None:
        """Record what one optimizer step moved: of `params` (full fine-tuning, by the
        sampler's names) or of the adapted layers `adapters` (LoRA, by the sampler's names)."""
        decay = any(group["weight_decay"] > 0 for group in optimizer.param_groups)

        def moment(param: torch.Tensor) -> torch.Tensor | None:
            return optimizer.state.get(param, {}).get("exp_avg")

        if adapters is None:
            for name, param in params.items():
                first = moment(param)
                if first is not None:
                    experts = param.dim() == 3 and ".experts." in name and not decay
                    self._add(name, first.flatten(1).ne(0).any(1) if experts else None)
            return
        for name, layer in adapters.items():
            down = moment(layer.lora_A["default"].weight)
            up = moment(layer.lora_B["default"].weight)
            if down is None and up is None:
                continue
            count = getattr(layer, "num_experts", 1)
            if decay or count == 1:
                self._add(name, None)
                continue
            present = next(m for m in (down, up) if m is not None)
            moved = torch.zeros(count, dtype=torch.bool, device=present.device)
            if down is not None:
                moved |= down.reshape(count, -1).ne(0).any(1)
            if up is not None:
                moved |= up.reshape(up.shape[0], -1, count).ne(0).any(0).any(0)
            self._add(name, moved)

    def _add(self, name: str, moved: Moved) -> None:
        if name in self._moved and (self._moved[name] is None or moved is None):
            self._moved[name] = None
            return
        earlier = self._moved.get(name)
        self._moved[name] = moved if earlier is None or moved is None else moved | earlier

    def changed(self, tensors: Mapping[str, torch.Tensor]) -> ChangedWeights | None:
        """What moved since the servers' version, or None when they need everything."""
        if self.published is None:
            return None
        rows: dict[str, tuple[int, ...] | None] = {}
        for name, moved in self._moved.items():
            if name not in tensors:
                return None  # a name the sampler does not know: send everything
            if moved is None:
                rows[name] = None
            elif bool(moved.any()):
                rows[name] = tuple(moved.nonzero().flatten().tolist())
        return ChangedWeights(self.published, rows)

    def sent(self, version: int) -> None:
        """The servers now hold `version`."""
        self.published, self._moved = version, {}


def bytes_of(changed: ChangedWeights, tensors: Mapping[str, torch.Tensor]) -> int:
    """Bytes of tensor data a server holding `changed.since_version` copies."""
    total = 0
    for name, rows in changed.rows.items():
        tensor = tensors[name]
        whole = tensor.numel() * tensor.element_size()
        total += whole if rows is None else whole // tensor.shape[0] * len(rows)
    return total
