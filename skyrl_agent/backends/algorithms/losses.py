"""Per-token policy losses to minimize.

Every loss returns `(loss_BT, metrics)`: `loss_BT` is neither masked nor reduced (a reduction in
`reductions` weights it), `metrics` are floats over the tokens where `mask_BT` is nonzero.
`logprobs_BT` carries the gradient; `old_logprobs_BT` (the ratio's denominator) and the
advantages are constants and are detached here. Log-ratios are clamped to [-20, 20] so that a
wild ratio cannot overflow to inf (and NaN in the backward pass).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

LossOutput = tuple[torch.Tensor, dict[str, float]]
PolicyLoss = Callable[..., LossOutput]

MAX_LOG_RATIO = 20.0


def _log_ratio(logprobs_BT: torch.Tensor, old_logprobs_BT: torch.Tensor) -> torch.Tensor:
    return (logprobs_BT - old_logprobs_BT.detach()).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)


def _fraction(flags: torch.Tensor, mask: torch.Tensor) -> float:
    """Share of the masked-in entries where `flags` holds (0 when none is masked in)."""
    keep = mask != 0
    return float((flags & keep).sum().item() / max(int(keep.sum().item()), 1))


def ppo_clip_loss(logprobs_BT: torch.Tensor, old_logprobs_BT: torch.Tensor,
                  advantages_BT: torch.Tensor, mask_BT: torch.Tensor, clip_low: float = 0.2,
                  clip_high: float = 0.2, dual_clip: float | None = None) -> LossOutput:
    """PPO-clip (Schulman et al. 2017, eq. 7) with DAPO's asymmetric range (Yu et al. 2025,
    clip-higher) and optional dual-clip (Ye et al. 2020, "Mastering Complex Control in MOBA
    Games"):
        r = exp(logp - old),  loss = -min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A)
        and where A < 0:      loss = min(loss, -c * A)   (c = dual_clip > 1)
    Metrics: clip_fraction (tokens on the clipped branch), dual_clip_fraction."""
    if dual_clip is not None and dual_clip <= 1:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    advantages = advantages_BT.detach()
    ratio = _log_ratio(logprobs_BT, old_logprobs_BT).exp()
    unclipped = -ratio * advantages
    clipped = -ratio.clamp(1 - clip_low, 1 + clip_high) * advantages
    loss = torch.maximum(unclipped, clipped)
    metrics = {"clip_fraction": _fraction(clipped > unclipped, mask_BT)}
    dual_hit = torch.zeros_like(loss, dtype=torch.bool)
    if dual_clip is not None:
        bound = -dual_clip * advantages
        dual_hit = (advantages < 0) & (loss > bound)
        loss = torch.where(dual_hit, bound, loss)
    metrics["dual_clip_fraction"] = _fraction(dual_hit, mask_BT)
    return loss, metrics


def gspo_loss(logprobs_BT: torch.Tensor, old_logprobs_BT: torch.Tensor,
              advantages_BT: torch.Tensor, mask_BT: torch.Tensor, clip_low: float = 3e-4,
              clip_high: float = 4e-4) -> LossOutput:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"),
    GSPO-token form:
        s_i = exp(1/|y_i| * sum_t (logp_t - old_t))          (masked tokens of sequence i)
        s_i,t = sg[s_i] * exp(logp_t - sg[logp_t])            (value s_i, gradient per token)
        loss_t = -min(s_i,t * A_t, clip(s_i,t, 1 - clip_low, 1 + clip_high) * A_t)
    With one advantage per sequence and the seq-mean-token-mean reduction this is the paper's
    sequence-level objective in value and gradient. Metric clip_fraction: share of sequences
    (with a masked-in token) where some masked-in token is on the clipped branch."""
    advantages = advantages_BT.detach()
    mask = (mask_BT != 0).to(logprobs_BT.dtype)
    log_ratio = torch.where(mask != 0, logprobs_BT - old_logprobs_BT.detach(), 0.0)
    length_B = mask.sum(dim=-1)
    seq_log_ratio_B = (log_ratio.sum(dim=-1) / length_B.clamp(min=1))
    seq_log_ratio_B = seq_log_ratio_B.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO).detach()
    ratio = (seq_log_ratio_B[:, None] + logprobs_BT - logprobs_BT.detach()).exp()
    unclipped = -ratio * advantages
    clipped = -ratio.clamp(1 - clip_low, 1 + clip_high) * advantages
    loss = torch.maximum(unclipped, clipped)
    seq_clipped_B = ((clipped > unclipped) & (mask != 0)).any(dim=-1)
    return loss, {"clip_fraction": _fraction(seq_clipped_B, length_B)}


def cispo_loss(logprobs_BT: torch.Tensor, old_logprobs_BT: torch.Tensor,
               advantages_BT: torch.Tensor, mask_BT: torch.Tensor, clip_low: float = 1.0,
               clip_high: float = 0.28) -> LossOutput:
    """CISPO (MiniMax 2025, "MiniMax-M1"): the importance weight is clipped and
    detached, so every token keeps a gradient:
        loss = -sg(clip(exp(logp - old), 1 - clip_low, 1 + clip_high)) * A * logp
    Metric clip_fraction: masked-in tokens whose ratio lies outside the range."""
    ratio = _log_ratio(logprobs_BT, old_logprobs_BT).detach().exp()
    low, high = 1 - clip_low, 1 + clip_high
    weight = ratio.clamp(low, high)
    loss = -weight * advantages_BT.detach() * logprobs_BT
    return loss, {"clip_fraction": _fraction((ratio < low) | (ratio > high), mask_BT)}


def importance_sampling_loss(logprobs_BT: torch.Tensor, old_logprobs_BT: torch.Tensor,
                             advantages_BT: torch.Tensor, mask_BT: torch.Tensor) -> LossOutput:
    """Tinker's `importance_sampling` loss (REINFORCE with an unclipped importance ratio,
    Williams 1992 / off-policy policy gradient): loss = -exp(logp - old) * A."""
    ratio = _log_ratio(logprobs_BT, old_logprobs_BT).exp()
    return -ratio * advantages_BT.detach(), {}


def dro_loss(logprobs_BT: torch.Tensor, old_logprobs_BT: torch.Tensor,
             advantages_BT: torch.Tensor, mask_BT: torch.Tensor, beta: float = 0.05,
             ) -> LossOutput:
    """DRO, Direct Reward Optimization (Richemond et al. 2024, "Offline Regularised
    Reinforcement Learning for Large Language Models Alignment"; the per-token form Kimi k1.5
    uses, Kimi Team 2025): a policy gradient on log p with a quadratic penalty on the log-ratio
    to the sampler instead of a clip, so it stays well-defined off-policy:
        loss = -(logp * A - beta / 2 * (logp - old)^2)
    The soft advantages the paper pairs it with are the caller's to compute. Metric
    log_ratio_sq: mean of (logp - old)^2 over the masked-in tokens."""
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    log_ratio = _log_ratio(logprobs_BT, old_logprobs_BT)
    loss = -(logprobs_BT * advantages_BT.detach() - 0.5 * beta * log_ratio.square())
    keep = (mask_BT != 0).to(loss.dtype)
    squared = float((log_ratio.detach().square() * keep).sum() / keep.sum().clamp(min=1))
    return loss, {"log_ratio_sq": squared}


def cross_entropy_loss(logprobs_BT: torch.Tensor, mask_BT: torch.Tensor) -> LossOutput:
    """Supervised negative log-likelihood: loss = -logp (weights come with the reduction)."""
    return -logprobs_BT, {}


POLICY_LOSSES: dict[str, PolicyLoss] = {
    "ppo": ppo_clip_loss,
    "gspo": gspo_loss,
    "cispo": cispo_loss,
    "importance_sampling": importance_sampling_loss,
    "dro": dro_loss,
}
"""Policy losses by name; each is called as
`fn(logprobs_BT, old_logprobs_BT, advantages_BT, mask_BT, **config)`."""


def policy_loss(name: str, logprobs_BT: torch.Tensor, old_logprobs_BT: torch.Tensor,
                advantages_BT: torch.Tensor, mask_BT: torch.Tensor,
                **config: Any) -> LossOutput:
    """The loss `name` (a key of POLICY_LOSSES) with `config` as its keyword settings."""
    if name not in POLICY_LOSSES:
        raise ValueError(f"unknown policy loss {name!r}; known: {sorted(POLICY_LOSSES)}")
    return POLICY_LOSSES[name](logprobs_BT, old_logprobs_BT, advantages_BT, mask_BT, **config)
