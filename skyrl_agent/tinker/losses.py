"""Tinker's loss names and `loss_fn_config` keys, onto the trainer's `LossConfig`.

Tinker gives clip bounds as ratio thresholds (`clip_low_threshold: 0.8` = 1 - 0.2,
`clip_high_threshold: 1.28` = 1 + 0.28) and DRO's penalty as `beta`; its losses sum over tokens.
Every other LossConfig key (`reduction`, `kl_coef`, `kl_estimator`, `correction`, `dual_clip`,
...) passes through, which is how a KL term to the initial policy is asked for.
"""

from __future__ import annotations

from collections.abc import Mapping

from skyrl_agent.tinker.errors import TinkerUserError
from skyrl_agent.trainers.loss import LOSS_FNS, LossConfig, parse_loss_config

CLIPPED = ("ppo", "cispo", "gspo")
"""Losses whose clip bounds Tinker's thresholds set."""


def loss_config(loss_fn: str, config: Mapping[str, float | str] | None) -> LossConfig:
    """The LossConfig of one forward_backward; unknown losses and keys are the caller's error."""
    if loss_fn not in LOSS_FNS:
        raise TinkerUserError(f"unknown loss_fn {loss_fn!r}; this server supports "
                              f"{', '.join(LOSS_FNS)}")
    values = dict(config or {})
    low = values.pop("clip_low_threshold", None)
    high = values.pop("clip_high_threshold", None)
    if (low is not None or high is not None) and loss_fn not in CLIPPED:
        raise TinkerUserError(f"clip thresholds do not apply to {loss_fn}")
    try:
        if low is not None:
            values["clip_low"] = 1.0 - float(low)
        if high is not None:
            values["clip_high"] = float(high) - 1.0
    except (TypeError, ValueError):
        raise TinkerUserError("clip thresholds must be numbers") from None
    if "beta" in values and loss_fn != "dro":
        raise TinkerUserError(f"beta applies to dro only, not {loss_fn}")
    try:
        return parse_loss_config(values)
    except ValueError as exc:
        raise TinkerUserError(str(exc)) from None
