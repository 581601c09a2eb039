"""Reuse of the KV cache of finished sequences for prompts that extend them.

An agent's turn k+1 prompt is turn k's prompt + completion + a few new tokens, and sticky
routing sends it to the same server, so most of its prefill is already computed.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from skyrl_agent.inference.server.kv import KV
from skyrl_agent.types import PlacedImage


class PrefixCache:
    """LRU of (token ids, per-layer KV) for up to `max_tokens` tokens in all; for an MoE model
    also the experts each cached token was routed to, so a request served from the cache still
    reports the routing of its whole prompt."""

    def __init__(self, max_tokens: int, min_match: int = 16) -> None:
        self.max_tokens = max_tokens
        self.min_match = min_match
        self._entries: OrderedDict[tuple[int, ...], tuple[list[KV], np.ndarray | None]] = \
            OrderedDict()
        self._tokens = self._bytes = 0

    def lookup(self, prompt_ids: list[int],
               ) -> tuple[int, list[KV] | None, np.ndarray | None]:
        """The longest cached prefix of `prompt_ids` (at most len - 1 tokens), its KV views and
        its routing (MoE models)."""
        best_len, best_key = 0, None
        for key in self._entries:
            matched = _shared_prefix_len(key, prompt_ids)
            if matched > best_len:
                best_len, best_key = matched, key
        best_len = min(best_len, len(prompt_ids) - 1)  # the last prompt token must run for logits
        if best_key is None or best_len < self.min_match:
            return 0, None, None
        self._entries.move_to_end(best_key)
        layers, routing = self._entries[best_key]
        return (best_len, [(k[:, :, :best_len], v[:, :, :best_len]) for k, v in layers],
                None if routing is None else routing[:best_len])

    def store(self, token_ids: list[int], layers: list[KV],
              routing: np.ndarray | None = None) -> None:
        key = tuple(token_ids)
        if len(key) > self.max_tokens or any(k[: len(key)] == key for k in self._entries):
            return  # already covered by an entry that extends it
        # An entry that is a prefix of the new one is redundant: the new one answers its lookups.
        for old in [k for k in self._entries if key[: len(k)] == k]:
            self._drop(old)
        self._entries[key] = (layers, routing)
        self._tokens += len(key)
        self._bytes += _nbytes(layers)
        self.shrink_to(self.max_tokens)

    @property
    def nbytes(self) -> int:
        """Bytes of the cached keys and values."""
        return self._bytes

    def shrink_to(self, tokens: int) -> None:
        """Drop least recently used entries until at most `tokens` tokens are held."""
        while self._entries and self._tokens > tokens:
            self._drop(next(iter(self._entries)))

    def clear(self) -> None:
        """Forget everything (after a weight update the cached KV is stale)."""
        self._entries.clear()
        self._tokens = self._bytes = 0

    def _drop(self, key: tuple[int, ...]) -> None:
        layers, _ = self._entries.pop(key)
        self._tokens -= len(key)
        self._bytes -= _nbytes(layers)


def image_cache_key(prompt_ids: list[int], images: tuple[PlacedImage, ...]) -> list[int]:
    """`prompt_ids` with each image's span replaced by ids no token has (negative, from the
    image's hash), so prefixes match only where the pictures are the same."""
    key = list(prompt_ids)
    for image in images:
        mark = -1 - int(image.sha256[:15], 16)
        key[image.offset : image.end] = [mark] * image.length
    return key


def whole_images(cached: int, layers: list[KV] | None, routing: np.ndarray | None,
                 images: tuple[PlacedImage, ...],
                 ) -> tuple[int, list[KV] | None, np.ndarray | None]:
    """A cached prefix cut back to the start of an image it ends inside: the model encodes an
    image whole, in one forward."""
    cut = next((image.offset for image in images if image.offset < cached < image.end), cached)
    if cut == cached or layers is None:
        return cached, layers, routing
    if cut == 0:
        return 0, None, None
    return (cut, [(k[:, :, :cut], v[:, :, :cut]) for k, v in layers],
            None if routing is None else routing[:cut])


def _nbytes(layers: list[KV]) -> int:
    return sum(k.nbytes + v.nbytes for k, v in layers)


def _shared_prefix_len(a: tuple[int, ...], b: list[int]) -> int:
    """How many leading token ids `a` and `b` have in common."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
