"""The KV cache of the running batch: left-padded rows that can be merged, selected and grown.

Continuous batching needs to add a freshly prefilled request to the running batch and drop
finished ones between decode steps. Rows are left-padded to a common length and the attention
mask hides the padding, so each row computes exactly what it would alone.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

KV = tuple[torch.Tensor, torch.Tensor]
"""One layer's keys and values, each [batch, kv_heads, tokens, head_dim]."""


class GrowingLayer(DynamicLayer):
    """A cache layer backed by a buffer with spare room.

    transformers' DynamicLayer concatenates on every step, copying the whole cache per token;
    here a decode step writes one slot and the buffer doubles only when full.
    """

    # Optional in the base class (unset before lazy initialization); always set here by _write.
    keys: torch.Tensor
    values: torch.Tensor

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.lazy_initialization(keys, values)
        self._key_buffer = self._value_buffer = keys  # replaced just below
        self.length = 0
        self._reserve(keys, values, keys.shape[-2])
        self._write(keys, values)

    def _reserve(self, keys: torch.Tensor, values: torch.Tensor, needed: int) -> None:
        capacity = max(64, needed * 2)
        shape = (*keys.shape[:-2], capacity, keys.shape[-1])
        key_buffer = keys.new_empty(shape)
        value_buffer = values.new_empty(shape)
        if self.length:
            key_buffer[..., : self.length, :] = self._key_buffer[..., : self.length, :]
            value_buffer[..., : self.length, :] = self._value_buffer[..., : self.length, :]
        self._key_buffer, self._value_buffer = key_buffer, value_buffer

    def _write(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        end = self.length + keys.shape[-2]
        if end > self._key_buffer.shape[-2]:
            self._reserve(keys, values, end)
        self._key_buffer[..., self.length : end, :] = keys
        self._value_buffer[..., self.length : end, :] = values
        self.length = end
        self.keys = self._key_buffer[..., :end, :]
        self.values = self._value_buffer[..., :end, :]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> KV:
        self._write(key_states, value_states)
        return self.keys, self.values


class KVBatch:
    """Per-layer KV tensors of B rows plus the [B, T] attention mask (0 on left padding)."""

    def __init__(self, layers: list[KV], mask: torch.Tensor) -> None:
        self.mask = mask
        self.cache = Cache(layers=[GrowingLayer(k, v) for k, v in layers])

    @classmethod
    def from_cache(cls, cache: Cache, rows: int) -> KVBatch:
        """Wrap a one-row prefill cache, repeated `rows` times (the `n` samples of one prompt)."""
        # Cache.layers is typed as every layer kind (some without keys, or keys still None); a
        # prefill cache of the models served here holds filled attention layers only.
        layers = [(layer.keys.expand(rows, -1, -1, -1),  # type: ignore[union-attr]
                   layer.values.expand(rows, -1, -1, -1))  # type: ignore[union-attr]
                  for layer in cache.layers]
        length = layers[0][0].shape[-2]
        return cls(layers, torch.ones(rows, length, dtype=torch.long, device=layers[0][0].device))

    @property
    def rows(self) -> int:
        return self.mask.shape[0]

    def layers(self) -> list[KV]:
        # Every layer is a GrowingLayer (see __init__); Cache.layers is typed as any layer kind.
        return [(layer.keys, layer.values)  # type: ignore[union-attr,misc]
                for layer in self.cache.layers]

    def append_mask_column(self) -> torch.Tensor:
        """Extend the mask by one real token per row (the token about to be decoded)."""
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.rows, 1)], dim=1)
        return self.mask

    def merge(self, other: KVBatch) -> KVBatch:
        """This batch's rows followed by `other`'s, left-padded to the longer of the two."""
        length = max(self.mask.shape[1], other.mask.shape[1])
        layers = [
            (torch.cat([_left_pad(k1, length), _left_pad(k2, length)]),
             torch.cat([_left_pad(v1, length), _left_pad(v2, length)]))
            for (k1, v1), (k2, v2) in zip(self.layers(), other.layers(), strict=True)
        ]
        mask = torch.cat([_left_pad(self.mask, length), _left_pad(other.mask, length)])
        return KVBatch(layers, mask)

    def select(self, rows: list[int]) -> KVBatch:
        """Only these rows, with padding columns no remaining row needs cut off."""
        index = torch.tensor(rows, dtype=torch.long, device=self.mask.device)
        mask = self.mask[index]
        first_real = int((mask.sum(0) > 0).nonzero()[0]) if len(rows) else 0
        layers = [(k[index, :, first_real:], v[index, :, first_real:]) for k, v in self.layers()]
        return KVBatch(layers, mask[:, first_real:])

    def row(self, row: int, tokens: int) -> list[KV]:
        """The last `tokens` positions of one row (its real tokens), for the prefix cache."""
        length = self.mask.shape[1]
        return [(k[row : row + 1, :, length - tokens :].clone(),
                 v[row : row + 1, :, length - tokens :].clone()) for k, v in self.layers()]


def _left_pad(tensor: torch.Tensor, length: int) -> torch.Tensor:
    """Zero-pad the token dimension (-2 for KV, -1 for masks) on the left up to `length`."""
    dim = -1 if tensor.dim() == 2 else -2
    missing = length - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)
