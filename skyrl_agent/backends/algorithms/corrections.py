"""Off-policy corrections for the mismatch between the sampler (inference server) and the
trainer's own computation of the same policy.

Inputs: `old_logprobs_BT` (the trainer's logprobs before the update), `sampler_logprobs_BT`
(what the inference server reported) and `mask_BT` (0/1). Each correction returns
`(weights_BT, metrics)`: a detached float tensor to multiply into the per-token loss, 0 wherever
the mask is 0 (whatever the logprobs hold there, NaN included).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Correction = Callable[..., tuple[torch.Tensor, dict[str, float]]]


def _log_ratio(old_logprobs_BT: torch.Tensor, sampler_logprobs_BT: torch.Tensor,
               mask_BT: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """log(pi_trainer / pi_sampler) per token (0 where masked out) and the boolean mask."""
    keep = mask_BT != 0
    diff = old_logprobs_BT.detach().float() - sampler_logprobs_BT.detach().float()
    return torch.where(keep, diff, 0.0), keep


def _check_range(low: float, high: float) -> None:
    if not 0 <= low < high:
        raise ValueError(f"need 0 <= low < high, got low={low}, high={high}")


def truncated_is_weights(old_logprobs_BT: torch.Tensor, sampler_logprobs_BT: torch.Tensor,
                         mask_BT: torch.Tensor, cap: float = 2.0,
                         ) -> tuple[torch.Tensor, dict[str, float]]:
    """TIS (Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL
    Training"): w_t = min(pi_trainer(y_t) / pi_sampler(y_t), C) = min(exp(old - sampler), cap).
    Metrics: tis_capped_fraction (masked-in tokens above the cap), tis_mean_weight."""
    if cap <= 0:
        raise ValueError(f"cap must be positive, got {cap}")
    log_ratio, keep = _log_ratio(old_logprobs_BT, sampler_logprobs_BT, mask_BT)
    ratio = log_ratio.exp()
    weights = torch.where(keep, ratio.clamp(max=cap), 0.0)
    tokens = max(int(keep.sum().item()), 1)
    return weights, {
        "tis_capped_fraction": float(((ratio > cap) & keep).sum().item() / tokens),
        "tis_mean_weight": float(weights.sum().item() / tokens),
    }


def sequence_mask_geometric(old_logprobs_BT: torch.Tensor, sampler_logprobs_BT: torch.Tensor,
                            mask_BT: torch.Tensor, low: float = 0.5, high: float = 2.0,
                            ) -> tuple[torch.Tensor, dict[str, float]]:
    """MIS, sequence-level masked importance sampling with the geometric-mean ratio (as in
    Liu, Li et al. 2025, "When Speed Kills Stability: Demystifying RL Collapse from the
    Training-Inference Mismatch"):
        rho_i = exp(1/|y_i| * sum_t (old_t - sampler_t)),   w_i,t = 1[low <= rho_i <= high]
    Metric mis_masked_fraction: share of sequences (with a masked-in token) rejected."""
    _check_range(low, high)
    log_ratio, keep = _log_ratio(old_logprobs_BT, sampler_logprobs_BT, mask_BT)
    length_B = keep.sum(dim=-1)
    rho_B = (log_ratio.sum(dim=-1) / length_B.clamp(min=1)).exp()
    accepted_B = (rho_B >= low) & (rho_B <= high)
    weights = (keep & accepted_B[:, None]).float()
    present_B = length_B > 0
    rejected = (present_B & ~accepted_B).sum().item()
    return weights, {"mis_masked_fraction": float(rejected / max(int(present_B.sum().item()), 1))}


def icepop_mask(old_logprobs_BT: torch.Tensor, sampler_logprobs_BT: torch.Tensor,
                mask_BT: torch.Tensor, low: float = 0.5, high: float = 2.0,
                ) -> tuple[torch.Tensor, dict[str, float]]:
    """IcePop (Ling Team 2025, Ring-1T, "Every Step Evolves"): token-level masking of the
    discrepancy, w_t = 1[low <= exp(old_t - sampler_t) <= high].
    Metric icepop_masked_fraction: share of masked-in tokens dropped."""
    _check_range(low, high)
    log_ratio, keep = _log_ratio(old_logprobs_BT, sampler_logprobs_BT, mask_BT)
    ratio = log_ratio.exp()
    accepted = (ratio >= low) & (ratio <= high)
    dropped = (keep & ~accepted).sum().item()
    return (keep & accepted).float(), {
        "icepop_masked_fraction": float(dropped / max(int(keep.sum().item()), 1)),
    }


CORRECTIONS: dict[str, Correction] = {
    "tis": truncated_is_weights,
    "mis": sequence_mask_geometric,
    "icepop": icepop_mask,
}
"""Corrections by name; each is called as `fn(old_logprobs_BT, sampler_logprobs_BT, mask_BT,
**config)`."""
