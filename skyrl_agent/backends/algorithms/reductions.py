"""Loss reductions expressed as per-token weights: `loss = (loss_BT * weights_BT).sum()`.

Compute the weights once on the whole (mini-)batch and slice them along with the micro-batches:
the micro-batches' weighted sums then add up to exactly the full-batch loss, whatever the split.
"""

from __future__ import annotations

import torch

REDUCTIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm", "sum")
"""The reduction names token_weights accepts."""


def token_weights(mask_BT: torch.Tensor, reduction: str,
                  norm_len: float | None = None) -> torch.Tensor:
    """Per-token weights (0 where the mask is 0; all zeros, never NaN, for an empty mask):
    - "token-mean" (DAPO, Yu et al. 2025): w = m / sum(m), every token alike;
    - "seq-mean-token-mean" (GRPO, Shao et al. 2024, eq. 3): w = m / (S * |y_i|), S = sequences
      with a masked-in token;
    - "seq-mean-token-sum-norm" (Dr. GRPO, Liu et al. 2025): w = m / (S * norm_len), a constant
      normalizer instead of each sequence's length;
    - "sum" (Tinker's convention): w = m.
    Float64 masks stay float64; every other mask gives float32 weights."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; known: {REDUCTIONS}")
    dtype = torch.float64 if mask_BT.dtype == torch.float64 else torch.float32
    mask = (mask_BT != 0).to(dtype)
    if reduction == "sum":
        return mask
    if reduction == "token-mean":
        return mask / mask.sum().clamp(min=1)
    length_B = mask.sum(dim=-1)
    sequences = (length_B > 0).sum().clamp(min=1).to(dtype)
    if reduction == "seq-mean-token-mean":
        return mask / (sequences * length_B.clamp(min=1))[:, None]
    if norm_len is None or not norm_len > 0:
        raise ValueError(f"seq-mean-token-sum-norm needs a positive norm_len, got {norm_len}")
    return mask / (sequences * norm_len)


def reduce(loss_BT: torch.Tensor, mask_BT: torch.Tensor, reduction: str,
           norm_len: float | None = None) -> torch.Tensor:
    """The scalar loss sum(loss_BT * token_weights(mask_BT, reduction, norm_len)); positions
    the mask leaves out contribute 0 even if the loss holds inf or NaN there."""
    weights = token_weights(mask_BT, reduction, norm_len)
    return torch.where(weights != 0, loss_BT * weights, 0.0).sum()
