"""The KV cache of the running batch: left-padded rows that can be joined, selected and grown.

Continuous batching needs to add a freshly prefilled request to the running batch and drop
finished ones between decode steps. Rows are left-padded to a common length and the attention
mask hides the padding, so each row computes exactly what it would alone.

Memory stays within what the engine reserved for the batch (rows x the longest row's
`max_length`): a buffer never grows past `max_length`, and joining or selecting rows rebuilds
one layer at a time, freeing the old layer before the next, so the copy costs one layer beside
the batch, not a second batch.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

KV = tuple[torch.Tensor, torch.Tensor]
"""One layer's keys and values, each [batch, kv_heads, tokens, head_dim]."""


def capacity_for(needed: int, max_length: int) -> int:
    """Buffer room for `needed` tokens: spare up to twice that, so a decode step rarely copies,
    but never past `max_length` (the most tokens a row of the batch can hold)."""
    return max(needed, min(max(64, 2 * needed), max_length))


class GrowingLayer(DynamicLayer):
    """A cache layer backed by a buffer with spare room.

    transformers' DynamicLayer concatenates on every step, copying the whole cache per token;
    here a decode step writes one slot and the buffer grows only when full.
    """

    # Optional in the base class (unset before lazy initialization); always set here.
    keys: torch.Tensor
    values: torch.Tensor

    def __init__(self, key_buffer: torch.Tensor, value_buffer: torch.Tensor, length: int,
                 max_length: int) -> None:
        super().__init__()
        self.lazy_initialization(key_buffer, value_buffer)
        self._key_buffer, self._value_buffer = key_buffer, value_buffer
        self.length = length
        self.max_length = max_length
        self._expose()

    @property
    def nbytes(self) -> int:
        return self._key_buffer.nbytes + self._value_buffer.nbytes

    @property
    def capacity(self) -> int:
        """Tokens a row's buffer holds before it must grow."""
        return self._key_buffer.shape[-2]

    def _expose(self) -> None:
        self.keys = self._key_buffer[..., : self.length, :]
        self.values = self._value_buffer[..., : self.length, :]

    def _grow(self, needed: int) -> None:
        capacity = capacity_for(needed, self.max_length)
        buffers = []
        for old in (self._key_buffer, self._value_buffer):
            new = old.new_empty((*old.shape[:-2], capacity, old.shape[-1]))
            new[..., : self.length, :] = old[..., : self.length, :]
            buffers.append(new)
        self._key_buffer, self._value_buffer = buffers

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> KV:
        end = self.length + key_states.shape[-2]
        if end > self._key_buffer.shape[-2]:
            self._grow(end)
        self._key_buffer[..., self.length : end, :] = key_states
        self._value_buffer[..., self.length : end, :] = value_states
        self.length = end
        self._expose()
        return self.keys, self.values


def _right_aligned(parts: list[tuple[torch.Tensor, int]], length: int,
                   max_length: int) -> torch.Tensor:
    """One buffer holding each part's `rows` (a part of one row is repeated) right-aligned at
    `length` tokens, the left padding zeroed (masked, but it must not hold NaN)."""
    first = parts[0][0]
    rows = sum(count for _, count in parts)
    buffer = first.new_empty((rows, first.shape[1], capacity_for(length, max_length),
                              first.shape[-1]))
    start = 0
    for tensor, count in parts:
        tokens = tensor.shape[-2]
        buffer[start : start + count, :, : length - tokens].zero_()
        buffer[start : start + count, :, length - tokens : length] = tensor
        start += count
    return buffer


class KVBatch:
    """Per-layer KV of B rows plus the [B, T] attention mask (0 on left padding)."""

    def __init__(self, layers: list[GrowingLayer], mask: torch.Tensor) -> None:
        self.mask = mask
        self.cache = Cache(layers=list(layers))

    @classmethod
    def from_prefill(cls, cache: Cache, rows: int, max_length: int) -> KVBatch:
        """A one-row prefill cache as `rows` rows (the `n` samples of one prompt)."""
        device = cache.layers[0].keys.device  # type: ignore[union-attr]
        batch = cls([], torch.zeros(0, 0, dtype=torch.long, device=device))
        batch.add_prefill(cache, rows, max_length)
        return batch

    @property
    def rows(self) -> int:
        return self.mask.shape[0]

    @property
    def width(self) -> int:
        """Token columns (the longest row; shorter rows are padded on the left)."""
        return self.mask.shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes of every layer's buffers (what the batch holds, spare room included)."""
        return sum(layer.nbytes for layer in self._layers())

    def held_tokens(self, width: int | None = None) -> int:
        """Token slots the buffers hold now, or once they have room for `width` columns."""
        layer = self._layers()[0]
        capacity = layer.capacity
        if width is not None and width > capacity:
            capacity = capacity_for(width, layer.max_length)
        return self.rows * capacity

    def _layers(self) -> list[GrowingLayer]:
        return self.cache.layers  # type: ignore[return-value] # every layer is a GrowingLayer

    def layers(self) -> list[KV]:
        return [(layer.keys, layer.values) for layer in self._layers()]

    def append_mask_column(self) -> torch.Tensor:
        """Extend the mask by one real token per row (the token about to be decoded)."""
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.rows, 1)], dim=1)
        return self.mask

    def add_prefill(self, cache: Cache, rows: int, max_length: int) -> None:
        """Append a one-row prefill cache as `rows` more rows, left-padded to the longer of the
        two; no row may then hold more than `max_length` tokens."""
        # A prefill cache of the models served here holds filled attention layers only.
        prefill: list[KV] = [(layer.keys, layer.values)  # type: ignore[union-attr,misc]
                             for layer in cache.layers]
        tokens = prefill[0][0].shape[-2]
        length = max(self.mask.shape[1], tokens)
        own = self.rows
        for i, (keys, values) in enumerate(prefill):
            if own:
                old = self._layers()[i]
                key_parts = [(old.keys, own), (keys, rows)]
                value_parts = [(old.values, own), (values, rows)]
            else:
                key_parts, value_parts = [(keys, rows)], [(values, rows)]
            layer = GrowingLayer(_right_aligned(key_parts, length, max_length),
                                 _right_aligned(value_parts, length, max_length), length,
                                 max_length)
            if own:
                self.cache.layers[i] = layer  # the old layer's buffers go now, not at the end
            else:
                self.cache.layers.append(layer)
        new_mask = torch.ones(rows, tokens, dtype=torch.long, device=self.mask.device)
        self.mask = torch.cat([_left_pad(self.mask, length), _left_pad(new_mask, length)])

    def select(self, rows: list[int], max_length: int) -> None:
        """Keep only these rows (at least one), cutting padding columns no kept row needs.
        A row's room does not grow here: fewer rows then always hold fewer token slots."""
        index = torch.tensor(rows, dtype=torch.long, device=self.mask.device)
        mask = self.mask[index]
        first_real = int((mask.sum(0) > 0).nonzero()[0])
        length = mask.shape[1] - first_real
        for i, old in enumerate(self._layers()):
            capacity = max(length, min(capacity_for(length, max_length), old.capacity))
            buffers = []
            for tensor in (old.keys, old.values):
                kept = tensor.new_empty((len(rows), tensor.shape[1], capacity, tensor.shape[-1]))
                for j, row in enumerate(rows):  # row by row: no gathered copy beside the batch
                    kept[j, :, :length] = tensor[row, :, first_real:]
                buffers.append(kept)
            self.cache.layers[i] = GrowingLayer(buffers[0], buffers[1], length, max_length)
        self.mask = mask[:, first_real:]

    def row(self, row: int, tokens: int) -> list[KV]:
        """The last `tokens` positions of one row (its real tokens), for the prefix cache."""
        length = self.mask.shape[1]
        return [(k[row : row + 1, :, length - tokens :].clone(),
                 v[row : row + 1, :, length - tokens :].clone()) for k, v in self.layers()]


def held_after_prefill(batch: KVBatch | None, rows: int, tokens: int, max_length: int) -> int:
    """Token slots held while and after `rows` rows of a `tokens`-long prefill join `batch`
    (add_prefill: the longer width, room by capacity_for; the old layers go one by one)."""
    if batch is None:
        return rows * capacity_for(tokens, max_length)
    joined = (batch.rows + rows) * capacity_for(max(batch.width, tokens), max_length)
    return max(batch.held_tokens(), joined)


def _left_pad(tensor: torch.Tensor, length: int) -> torch.Tensor:
    """Zero-pad a [rows, tokens] mask on the left up to `length` tokens."""
    missing = length - tensor.shape[-1]
    if missing == 0:
        return tensor
    return torch.cat([tensor.new_zeros(tensor.shape[0], missing), tensor], dim=-1)
