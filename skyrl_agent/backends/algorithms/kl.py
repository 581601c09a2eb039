"""KL penalty estimators and the policy's entropy."""

from __future__ import annotations

import torch

KL_ESTIMATORS = ("k1", "k2", "k3")


def kl_penalty(logprobs_BT: torch.Tensor, ref_logprobs_BT: torch.Tensor,
               estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from the sampled tokens' logprobs (Schulman 2020,
    "Approximating KL Divergence"), with d = logp - ref (the reference is detached):
        k1 = d,   k2 = 0.5 * d^2,   k3 = exp(-d) + d - 1 = exp(ref - logp) - (ref - logp) - 1"""
    diff = logprobs_BT - ref_logprobs_BT.detach()
    if estimator == "k1":
        return diff
    if estimator == "k2":
        return 0.5 * diff.square()
    if estimator == "k3":
        return torch.expm1(-diff) + diff
    raise ValueError(f"unknown KL estimator {estimator!r}; known: {KL_ESTIMATORS}")


def entropy_BT(logits_BTV: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) at each position (Shannon; used as in e.g. Williams & Peng
    1991's entropy bonus):
        H = -sum_v p_v * log p_v = logsumexp(z) - sum_v p_v * z_v
    computed from the logsumexp, with one V-sized temporary (the probabilities) and no
    log_softmax copy. The logits must be finite (mask a vocabulary entry with a large negative
    number, not -inf). The result keeps the logits' dtype."""
    lse_BT = torch.logsumexp(logits_BTV, dim=-1)
    probs_BTV = torch.softmax(logits_BTV, dim=-1)
    return lse_BT - torch.linalg.vecdot(probs_BTV, logits_BTV, dim=-1)
