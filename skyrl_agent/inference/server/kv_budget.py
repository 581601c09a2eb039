"""The engine's KV memory budget: the running batch and the prefix cache together.

The batch is admitted against its rows' reach (prompt + max_tokens each, padded to the longest),
so it can always grow to that. The prefix cache lives in the room the batch does not hold yet and
is evicted before the batch grows into it (the way vLLM's cached blocks are free blocks): the
batch never has to be preempted, and the sum never passes the budget.
"""

from __future__ import annotations

from typing import Any

import torch

from skyrl_agent.inference.server.kv import KVBatch
from skyrl_agent.inference.server.prefix_cache import PrefixCache


class KVBudgetExceeded(ValueError):
    """A request whose KV could not fit in the engine's budget even with nothing else running."""


class KVBudget:
    """`kv_cache_mb` of keys and values, in token slots of the model's dtype."""

    def __init__(self, model: Any, device: torch.device, kv_cache_mb: float,
                 prefix: PrefixCache) -> None:
        self.token_bytes = kv_bytes_per_token(model, device)
        self.tokens = int(kv_cache_mb * 2**20) // self.token_bytes
        self.prefix = prefix
        self.peak_bytes = 0

    @property
    def bytes(self) -> int:
        return self.tokens * self.token_bytes

    def check_alone(self, max_length: int, prompt_tokens: int) -> None:
        """Refuse a request whose one row would not fit even with nothing else running (its
        `n` rows may join the batch in parts)."""
        needed = max_length + prompt_tokens
        if needed > self.tokens:
            raise KVBudgetExceeded(
                f"prompt + max_tokens = {max_length} tokens need "
                f"{needed * self.token_bytes / 2**20:.3g} MB of KV cache; this server's budget "
                f"is {self.bytes / 2**20:.3g} MB (lower max_tokens, or raise kv_cache_mb)")

    def make_room(self, batch_tokens: int, beside: int = 0) -> None:
        """Evict from the prefix cache so that a batch holding `batch_tokens` token slots fits
        beside `beside` more tokens of KV (admission made sure it can)."""
        self.prefix.shrink_to(self.tokens - batch_tokens - beside)

    def used_bytes(self, batch: KVBatch | None) -> int:
        return (0 if batch is None else batch.nbytes) + self.prefix.nbytes

    def note(self, batch: KVBatch | None, beside_tokens: int = 0) -> None:
        """Keep the peak of KV held, at the moments it peaks (plus tokens held beside)."""
        used = self.used_bytes(batch) + beside_tokens * self.token_bytes
        self.peak_bytes = max(self.peak_bytes, used)


def kv_bytes_per_token(model: Any, device: torch.device) -> int:
    """Bytes of keys and values one token adds to the cache (all layers, the model's dtype)."""
    with torch.no_grad():
        out = model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=device), use_cache=True,
                    logits_to_keep=1)
    return sum(layer.keys.nbytes + layer.values.nbytes for layer in out.cache.layers)
