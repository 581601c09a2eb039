"""Loss algorithms as pure torch functions: policy losses, off-policy corrections, KL penalties
and loss reductions (the loop's advantages are in `rl/advantages.py`). Shape suffixes: _BT
sequences x tokens, _B per sequence."""

from __future__ import annotations

from skyrl_agent.backends.algorithms.corrections import (
    CORRECTIONS,
    icepop_mask,
    sequence_mask_geometric,
    truncated_is_weights,
)
from skyrl_agent.backends.algorithms.kl import KL_ESTIMATORS, entropy_BT, kl_penalty
from skyrl_agent.backends.algorithms.losses import (
    POLICY_LOSSES,
    cispo_loss,
    cross_entropy_loss,
    dro_loss,
    gspo_loss,
    importance_sampling_loss,
    policy_loss,
    ppo_clip_loss,
)
from skyrl_agent.backends.algorithms.reductions import REDUCTIONS, reduce, token_weights

__all__ = [
    "CORRECTIONS",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "REDUCTIONS",
    "cispo_loss",
    "cross_entropy_loss",
    "dro_loss",
    "entropy_BT",
    "gspo_loss",
    "icepop_mask",
    "importance_sampling_loss",
    "kl_penalty",
    "policy_loss",
    "ppo_clip_loss",
    "reduce",
    "sequence_mask_geometric",
    "token_weights",
    "truncated_is_weights",
]
