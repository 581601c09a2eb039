"""RL algorithms as pure torch functions: advantages, policy losses, off-policy corrections,
KL penalties and loss reductions. Shape suffixes: _GN groups x samples, _BT sequences x tokens,
_B per sequence."""

from __future__ import annotations

from skyrl_agent.trainers.algorithms.advantages import (
    ADVANTAGES,
    compute_advantages,
    dr_grpo_advantages,
    grpo_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
)
from skyrl_agent.trainers.algorithms.corrections import (
    CORRECTIONS,
    icepop_mask,
    sequence_mask_geometric,
    truncated_is_weights,
)
from skyrl_agent.trainers.algorithms.kl import KL_ESTIMATORS, entropy_BT, kl_penalty
from skyrl_agent.trainers.algorithms.losses import (
    POLICY_LOSSES,
    cispo_loss,
    cross_entropy_loss,
    dro_loss,
    gspo_loss,
    importance_sampling_loss,
    policy_loss,
    ppo_clip_loss,
)
from skyrl_agent.trainers.algorithms.reductions import REDUCTIONS, reduce, token_weights

__all__ = [
    "ADVANTAGES",
    "CORRECTIONS",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "REDUCTIONS",
    "cispo_loss",
    "compute_advantages",
    "cross_entropy_loss",
    "dr_grpo_advantages",
    "dro_loss",
    "entropy_BT",
    "grpo_advantages",
    "gspo_loss",
    "icepop_mask",
    "importance_sampling_loss",
    "kl_penalty",
    "policy_loss",
    "ppo_clip_loss",
    "reduce",
    "reinforce_pp_baseline_advantages",
    "rloo_advantages",
    "sequence_mask_geometric",
    "token_weights",
    "truncated_is_weights",
]
