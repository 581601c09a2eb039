"""Choosing the next token, and the logprobs reported for it.

Reported logprobs are those of the raw model distribution (temperature 1, no top-p/top-k), as
vLLM reports by default: the quantity a trainer recomputes with a teacher-forced forward pass.
Sampling itself applies temperature, top-k and top-p.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples. Validated by the HTTP layer before it reaches the engine."""

    max_tokens: int
    """Most tokens to generate (the engine also stops at the context length)."""
    temperature: float = 1.0
    """0 = greedy."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p."""
    top_k: int = 0
    """Keep only the k most likely tokens (0 = all)."""
    seed: int | None = None
    """Seed of this request's generator; sample i of n uses seed + i."""
    stop: tuple[str, ...] = ()
    """Strings that end generation; the returned text stops before them, token ids keep them."""
    stop_token_ids: tuple[int, ...] = ()
    """Token ids that end generation, besides the model's end-of-sequence ids."""
    ignore_eos: bool = False
    """Keep generating past end-of-sequence tokens (benchmarks)."""
    logprobs: int | None = None
    """How many top alternatives to return per token (None = none, 0 = only the sampled one)."""


@dataclass(frozen=True)
class Choice:
    """One sampled token for one row of the batch."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]
    """The `logprobs` most likely tokens with their logprobs (empty when not asked for)."""


def choose(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator]) -> list[Choice]:
    """Sample one token per row of `logits` [rows, vocab], each row with its own params."""
    logits = logits.float().cpu()  # per-request CPU generators keep seeded sampling reproducible
    logprobs = torch.log_softmax(logits, dim=-1)
    choices = []
    for row, (p, generator) in enumerate(zip(params, generators, strict=True)):
        token = _sample_row(logits[row], p, generator)
        top: tuple[tuple[int, float], ...] = ()
        if p.logprobs:
            values, ids = logprobs[row].topk(p.logprobs)
            top = tuple(zip(ids.tolist(), values.tolist(), strict=True))
        choices.append(Choice(token, float(logprobs[row, token]), top))
    return choices


def _sample_row(logits: torch.Tensor, p: SamplingParams, generator: torch.Generator) -> int:
    if p.temperature == 0:
        return int(logits.argmax())
    scaled = logits / p.temperature
    if p.top_k and p.top_k < scaled.shape[-1]:
        kth = scaled.topk(p.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_logits, order = scaled.sort(descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        # Drop a token when the tokens before it already reach top_p; the first always stays.
        drop = (cumulative - sorted_logits.softmax(-1)) >= p.top_p
        scaled = scaled.scatter(0, order[drop], float("-inf"))
    probs = scaled.softmax(-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def make_generator(seed: int | None) -> torch.Generator:
    generator = torch.Generator()
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator
