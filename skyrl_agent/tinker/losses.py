"""Tinker's loss names and `loss_fn_config` keys, onto the trainer's `LossConfig`.

Tinker gives clip bounds as ratio thresholds (`clip_low_threshold: 0.8` = 1 - 0.2,
`clip_high_threshold: 1.28` = 1 + 0.28) and DRO's penalty as `beta`; its losses sum over tokens.
A call that names no threshold gets Tinker's own: PPO 0.8 / 1.2, CISPO 0.0 / 4.0 (a one-sided
clip). Tinker documents no default `beta`; DRO's is the trainer's, 0.05 (the value Tinker's docs
show). Every other LossConfig key (`reduction`, `kl_coef`, `kl_estimator`, `correction`,
`dual_clip`, ...) passes through, which is how a KL term to the initial policy is asked for.
"""

from __future__ import annotations

from collections.abc import Mapping

from skyrl_agent.backends.loss import LOSS_FNS, LossConfig, parse_loss_config
from skyrl_agent.tinker.errors import TinkerUserError

CLIPPED = ("ppo", "cispo", "gspo")
"""Losses whose clip bounds Tinker's thresholds set."""
TINKER_THRESHOLDS = {"ppo": (0.8, 1.2), "cispo": (0.0, 4.0)}
"""Tinker's (clip_low_threshold, clip_high_threshold) when a call names none (GSPO: the
trainer's own, the paper's)."""


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
    default_low, default_high = TINKER_THRESHOLDS.get(loss_fn, (None, None))
    if low is not None:
        low = _number("clip_low_threshold", low)
    elif "clip_low" not in values:  # the trainer's own key, given instead, wins
        low = default_low
    if high is not None:
        high = _number("clip_high_threshold", high)
    elif "clip_high" not in values:
        high = default_high
    if low is not None:
        if not 0.0 <= low <= 1.0:
            raise TinkerUserError(f"clip_low_threshold must be between 0 and 1, got {low:g}")
        values["clip_low"] = 1.0 - low
    if high is not None:
        if high < 1.0:
            raise TinkerUserError(f"clip_high_threshold must be at least 1, got {high:g}")
        values["clip_high"] = high - 1.0
    if "beta" in values and loss_fn != "dro":
        raise TinkerUserError(f"beta applies to dro only, not {loss_fn}")
    try:
        return parse_loss_config(values)
    except ValueError as exc:
        raise TinkerUserError(str(exc)) from None


def _number(name: str, value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TinkerUserError(f"{name} must be a number") from None
