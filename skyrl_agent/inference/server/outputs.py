"""What the engine hands back: finished samples, weight-update times, a stats snapshot."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np


@dataclass(frozen=True)
class SequenceOutput:
    """One finished sample."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...]
    """Per token, the requested number of (id, logprob) alternatives (empty tuples if none)."""
    policy_versions: tuple[int, ...]
    """Per token, the weight version that sampled it."""
    finish_reason: Literal["stop", "length", "abort"]
    text: str
    """Decoded text without special tokens, cut before a matched stop string."""
    cached_prompt_tokens: int
    """Prompt tokens whose KV came from the prefix cache."""
    routed_experts: np.ndarray | None = None
    """MoE models: [tokens, layers, top_k] experts chosen for every position the model ran on
    (the prompt, then every sampled token but the last)."""


@dataclass(frozen=True)
class WeightUpdateTimes:
    """Where a weight update's time went."""

    transfer_s: float
    """Staging the file into the back buffers, while decoding went on."""
    pause_s: float
    """The swap on the engine thread: the only time decoding waited."""


@dataclass(frozen=True)
class EngineStats:
    """A snapshot for /metrics."""

    requests_total: int
    prompt_tokens_total: int
    generation_tokens_total: int
    cached_prompt_tokens_total: int
    running: int
    waiting: int
    paused: bool
    policy_version: int
    tokens_per_second: float
    """Generated tokens per second over the last 10 s."""
    kv_budget_bytes: int
    kv_used_bytes: int
    """Running batch (its buffers, spare room included) plus prefix cache, now."""
    kv_peak_bytes: int
    """The most kv_used_bytes seen after any engine step since start."""
