"""Advantage estimators over groups of samples of the same prompt.

Inputs are `rewards_GN` (groups x samples, float) and `valid_GN` (bool): False marks padding or
a masked trajectory, which gets advantage 0 and counts in no statistic (its reward is never
read, so it may be anything, NaN included). Every estimator returns `advantages_GN` in the
rewards' floating dtype (float32 for integer rewards), zero where invalid.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Estimator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _prepare(rewards_GN: torch.Tensor, valid_GN: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Rewards zeroed where invalid, the validity as 0/1 floats, and each group's valid count."""
    if rewards_GN.shape != valid_GN.shape:
        raise ValueError(f"rewards {tuple(rewards_GN.shape)} and valid "
                         f"{tuple(valid_GN.shape)} differ in shape")
    dtype = rewards_GN.dtype if rewards_GN.is_floating_point() else torch.float32
    valid = valid_GN.to(torch.bool)
    rewards = torch.where(valid, rewards_GN.to(dtype), 0.0)
    weight = valid.to(dtype)
    return rewards, weight, weight.sum(dim=-1, keepdim=True)


def _group_centered(rewards_GN: torch.Tensor, valid_GN: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """r - group mean (zero where invalid), the 0/1 validity and the valid count per group."""
    rewards, weight, count_G1 = _prepare(rewards_GN, valid_GN)
    mean_G1 = rewards.sum(dim=-1, keepdim=True) / count_G1.clamp(min=1)
    return (rewards - mean_G1) * weight, weight, count_G1


def grpo_advantages(rewards_GN: torch.Tensor, valid_GN: torch.Tensor,
                    eps: float = 1e-6) -> torch.Tensor:
    """GRPO (Shao et al. 2024, DeepSeekMath, eq. 3 / outcome supervision):
    A_i = (r_i - mean(r)) / (std(r) + eps), the mean and the Bessel-corrected std taken over the
    group's valid samples. A group with fewer than 2 valid samples gets 0 (its lone sample is
    its own mean), as does a group whose rewards are all equal."""
    centered, _, count_G1 = _group_centered(rewards_GN, valid_GN)
    var_G1 = centered.square().sum(dim=-1, keepdim=True) / (count_G1 - 1).clamp(min=1)
    return centered / (var_G1.sqrt() + eps)


def dr_grpo_advantages(rewards_GN: torch.Tensor, valid_GN: torch.Tensor) -> torch.Tensor:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", sec. 3.2):
    A_i = r_i - mean(r), GRPO without the division by the group's std (a lone valid sample
    therefore gets 0)."""
    centered, _, _ = _group_centered(rewards_GN, valid_GN)
    return centered


def rloo_advantages(rewards_GN: torch.Tensor, valid_GN: torch.Tensor) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024, "Back to Basics", leave-one-out baseline):
    A_i = r_i - 1/(n-1) * sum_{j != i} r_j over the group's n valid samples, which equals
    n/(n-1) * (r_i - mean(r)). A group with fewer than 2 valid samples gets 0."""
    centered, _, count_G1 = _group_centered(rewards_GN, valid_GN)
    scale_G1 = count_G1 / (count_G1 - 1).clamp(min=1)
    return torch.where(count_G1 >= 2, centered * scale_G1, 0.0)


def reinforce_pp_baseline_advantages(rewards_GN: torch.Tensor, valid_GN: torch.Tensor,
                                     eps: float = 1e-6) -> torch.Tensor:
    """REINFORCE++-baseline (Hu et al. 2025, "REINFORCE++"): a_i = r_i - mean(group r), then
    normalized over every valid entry of the batch: A = (a - mean(a)) / (std(a) + eps), std
    Bessel-corrected. With fewer than 2 valid entries in the batch the un-normalized a is
    returned. Valid samples of a one-sample group (a = 0) count in the batch statistics."""
    centered, weight, _ = _group_centered(rewards_GN, valid_GN)
    total = weight.sum()
    if total < 2:
        return centered
    mean = centered.sum() / total
    std = (((centered - mean) * weight).square().sum() / (total - 1)).sqrt()
    return (centered - mean) / (std + eps) * weight


ADVANTAGES: dict[str, Estimator] = {
    "grpo": grpo_advantages,
    "dr_grpo": dr_grpo_advantages,
    "rloo": rloo_advantages,
    "reinforce_pp": reinforce_pp_baseline_advantages,
}
"""Estimators by the name a config uses."""


def compute_advantages(name: str, rewards_GN: torch.Tensor,
                       valid_GN: torch.Tensor) -> torch.Tensor:
    """The estimator `name` (a key of ADVANTAGES) with its default settings."""
    if name not in ADVANTAGES:
        raise ValueError(f"unknown advantage estimator {name!r}; known: {sorted(ADVANTAGES)}")
    return ADVANTAGES[name](rewards_GN, valid_GN)
