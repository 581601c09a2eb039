"""A loss function as a backend runs it: policy loss x off-policy correction + KL, then reduced.

Composes the pure functions of `algorithms/` for one micro-batch. Reductions are per-token
weights computed over the whole batch first (`algorithms.reductions.token_weights`), so a batch
split into micro-batches sums to exactly the loss of the whole batch.

The ratio's denominator: with no correction it is the sampling logprobs (Tinker's semantics: the
ratio itself corrects for the sampler). With a correction (TIS, MIS, icepop) it is the trainer's
own logprobs, detached, and the correction weighs the trainer/sampler mismatch separately
(decoupled PPO, Hilton et al. 2022): correcting twice would square the mismatch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from skyrl_agent.backends.algorithms import CORRECTIONS, POLICY_LOSSES, kl_penalty
from skyrl_agent.backends.algorithms.losses import cross_entropy_loss

LOSS_FNS = ("cross_entropy", *POLICY_LOSSES)
"""Every loss_fn a backend accepts."""


class LossConfig(BaseModel):
    """`loss_fn_config`: how the loss is shaped. Unset clip bounds use each loss's own default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reduction: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm",
                       "sum"] = "sum"
    """How per-token losses become one number; `sum` is Tinker's convention."""
    norm_len: float | None = Field(default=None, gt=0)
    """The constant of seq-mean-token-sum-norm (Dr. GRPO): usually the generation budget."""
    clip_low: float | None = Field(default=None, ge=0)
    clip_high: float | None = Field(default=None, ge=0)
    dual_clip: float | None = Field(default=None, gt=1)
    """PPO only: bound the loss of negative-advantage tokens at -dual_clip * A."""
    correction: Literal["none", "tis", "mis", "icepop"] = "none"
    """Off-policy correction of the trainer/sampler mismatch."""
    tis_cap: float = Field(default=2.0, gt=0)
    """TIS: the largest importance weight."""
    mask_low: float = Field(default=0.5, gt=0)
    mask_high: float = Field(default=2.0, gt=0)
    """MIS and icepop: ratios outside [mask_low, mask_high] are masked."""
    beta: float = Field(default=0.05, ge=0)
    """DRO only: weight of the quadratic log-ratio penalty (Tinker's `beta`)."""
    kl_coef: float = Field(default=0.0, ge=0)
    """Weight of the KL penalty to the reference policy (0 = none; needs ref logprobs)."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"


def parse_loss_config(config: LossConfig | Mapping[str, Any] | None) -> LossConfig:
    """A LossConfig from a mapping (as the Tinker API sends it); bad keys raise ValueError."""
    if isinstance(config, LossConfig):
        return config
    try:
        return LossConfig.model_validate(dict(config or {}))
    except ValidationError as exc:
        details = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"invalid loss_fn_config: {details}") from None


@dataclass
class MicroBatch:
    """One micro-batch's tensors, padded to [B, T]; padding has weight 0."""

    logprobs_BT: torch.Tensor
    """The trainer's logprobs of the targets, with gradient."""
    weights_BT: torch.Tensor
    """The data's loss weights (1 on sampled tokens)."""
    reduction_BT: torch.Tensor
    """Per-token factors of the reduction, computed over the whole batch."""
    sampler_logprobs_BT: torch.Tensor
    advantages_BT: torch.Tensor
    ref_logprobs_BT: torch.Tensor | None = None


def micro_batch_loss(loss_fn: str, config: LossConfig, batch: MicroBatch,
                     ) -> tuple[torch.Tensor, dict[str, float]]:
    """This micro-batch's share of the batch loss, and its metrics."""
    mask_BT = batch.weights_BT
    if loss_fn == "cross_entropy":
        # Weights scale each token's loss (Tinker's -logp * weights; 0/1 masks are the usual
        # case, real values are how a client-side custom loss sends its gradient).
        ce_BT, ce_metrics = cross_entropy_loss(batch.logprobs_BT, mask_BT)
        return (ce_BT * mask_BT * batch.reduction_BT).sum(), dict(ce_metrics)
    if loss_fn not in POLICY_LOSSES:
        raise ValueError(f"unknown loss_fn {loss_fn!r}; known: {', '.join(LOSS_FNS)}")
    trainer_BT = batch.logprobs_BT.detach()
    correction_BT = torch.ones_like(mask_BT)
    metrics: dict[str, float] = {}
    if config.correction == "none":
        old_BT = batch.sampler_logprobs_BT
    else:
        old_BT = trainer_BT
        correction_BT, metrics = _correction(config, trainer_BT, batch.sampler_logprobs_BT,
                                             mask_BT)
    loss_BT, policy_metrics = POLICY_LOSSES[loss_fn](
        batch.logprobs_BT, old_BT, batch.advantages_BT, mask_BT, **_loss_settings(loss_fn, config))
    metrics.update(policy_metrics)
    loss_BT = loss_BT * correction_BT
    if config.kl_coef > 0:
        if batch.ref_logprobs_BT is None:
            raise ValueError("kl_coef > 0 needs reference logprobs")
        kl_BT = kl_penalty(batch.logprobs_BT, batch.ref_logprobs_BT, config.kl_estimator)
        loss_BT = loss_BT + config.kl_coef * kl_BT
        metrics["kl_ref"] = _masked_mean(kl_BT.detach(), mask_BT)
    return (loss_BT * batch.reduction_BT).sum(), metrics


def _loss_settings(loss_fn: str, config: LossConfig) -> dict[str, float]:
    """The keyword settings `loss_fn` takes from the config: clip bounds, or DRO's beta."""
    if loss_fn == "dro":
        return {"beta": config.beta}
    settings = {k: v for k, v in (("clip_low", config.clip_low), ("clip_high", config.clip_high))
                if v is not None}
    if loss_fn == "ppo" and config.dual_clip is not None:
        settings["dual_clip"] = config.dual_clip
    return settings


def _correction(config: LossConfig, trainer_BT: torch.Tensor, sampler_BT: torch.Tensor,
                mask_BT: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    correct = CORRECTIONS[config.correction]
    if config.correction == "tis":
        weights_BT, metrics = correct(trainer_BT, sampler_BT, mask_BT, cap=config.tis_cap)
    else:
        weights_BT, metrics = correct(trainer_BT, sampler_BT, mask_BT, low=config.mask_low,
                                      high=config.mask_high)
    return weights_BT, dict(metrics)


def _masked_mean(values_BT: torch.Tensor, mask_BT: torch.Tensor) -> float:
    total = float(mask_BT.sum())
    return float((values_BT * mask_BT).sum()) / total if total else 0.0


def agreement(trainer_N: torch.Tensor, sampler_N: torch.Tensor) -> dict[str, float]:
    """Trainer vs sampler logprobs of the trained tokens: max and mean absolute difference, and
    KL(sampler || trainer) by the k3 estimator (nonnegative; the tokens were drawn from the
    sampler). On the same weights the differences are numerical noise; drift is a bug (wrong
    alignment, re-tokenization, a stale version)."""
    if trainer_N.numel() == 0:
        return {}
    diff_N = (trainer_N - sampler_N).double()
    return {"agreement/max_abs_diff": float(diff_N.abs().max()),
            "agreement/mean_abs_diff": float(diff_N.abs().mean()),
            "agreement/kl": float((diff_N.exp() - 1 - diff_N).mean())}
