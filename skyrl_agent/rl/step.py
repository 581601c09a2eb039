"""The training step both loops share: a step's groups -> advantages and sequences -> one
optimizer step on the backend, then the new weights published to the servers.

The reference loop (reference_loop.py) runs it in one sitting; the async loop (loop.py) overlaps
it with sampling.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from skyrl_agent.backends.backend import TrainerBackend
from skyrl_agent.backends.build import adam_params
from skyrl_agent.backends.loss import LossConfig
from skyrl_agent.config import RunConfig
from skyrl_agent.rl.batch import groups_to_batch
from skyrl_agent.rl.stream import GroupSlot
from skyrl_agent.rl.workers import GroupSource, ServerControl
from skyrl_agent.types import TrajectoryGroup, mean_time_account

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepResult:
    """What one step did."""

    step: int
    """Policy version the step's samples came from (0 = the initial weights)."""
    reward_mean: float
    """Mean reward of the step's unmasked samples."""
    metrics: Mapping[str, float]
    """Loss, grad norm, sampler/trainer agreement, entropy, timings."""


async def publish(backend: TrainerBackend, servers: ServerControl, version: int) -> float:
    """The backend's weights onto every server, each serving them from one of its decode steps
    on (sampling goes on meanwhile); seconds."""
    update = await asyncio.to_thread(backend.save_weights_for_sampler, version)
    started = time.perf_counter()
    await servers.send(update)
    return update.seconds + time.perf_counter() - started


def group_metrics(groups: list[TrajectoryGroup]) -> dict[str, float]:
    """What the step's samples were: pass rate (reward 1), masked ones by failure kind, how
    many tokens were sampled, and where their time went (time account means)."""
    samples = [t for g in groups for t in g.trajectories]
    kept = [t for t in samples if not t.masked]
    metrics = {"pass_rate": sum(t.reward.value >= 1.0 for t in kept) / max(len(kept), 1),
               "sampled_tokens": float(sum(len(turn.completion_ids) for t in samples
                                           for s in t.segments for turn in s.turns))}
    for t in samples:
        if t.masked:
            key = f"masked/{t.failure or 'other'}"
            metrics[key] = metrics.get(key, 0.0) + 1
    for bucket, seconds in mean_time_account(samples).items():
        metrics[f"time/{bucket}_s"] = seconds
    return metrics


def train_on(backend: TrainerBackend, config: RunConfig,
             groups: list[TrajectoryGroup]) -> dict[str, float]:
    """One optimizer step on the groups; the step's metrics."""
    trainer = config.trainer
    # Uniform groups still train the KL term when there is one: keep them then.
    skip = trainer.skip_uniform_groups and trainer.kl_coef == 0
    batch = groups_to_batch(groups, trainer.advantage, skip_uniform=skip)
    uniform = batch.uniform_groups
    if skip and not batch.data:  # uniform groups only: a step as usual, never a stalled run
        batch = groups_to_batch(groups, trainer.advantage)
    metrics: dict[str, float] = {"trajectories": batch.trajectories, "masked": batch.masked,
                                 "dropped_groups": batch.dropped_groups,
                                 "sequences": len(batch.data), **group_metrics(groups)}
    if skip:
        metrics["uniform_groups"] = uniform
    if not batch.data:
        log.warning("no trainable samples this step (all masked or uniform); weights unchanged")
        return metrics
    out = backend.forward_backward(batch.data, config.trainer.loss_fn, loss_config(config))
    step = backend.optim_step(adam_params(config.trainer))
    return {**metrics, **out.metrics, **step.metrics}


async def collect(collector: GroupSource, slots: list[GroupSlot]) -> list[TrajectoryGroup]:
    """The slots' groups, concurrently; in slot order."""
    return list(await asyncio.gather(
        *[collector.run_group(s.task, s.sample_indices) for s in slots]))


def reward_mean(groups: list[TrajectoryGroup]) -> float:
    rewards = [t.reward.value for g in groups for t in g.trajectories if not t.masked]
    return sum(rewards) / max(len(rewards), 1)


def loss_config(config: RunConfig) -> LossConfig:
    trainer = config.trainer
    return LossConfig(
        reduction=trainer.reduction,
        norm_len=float(config.agent.max_turns * config.inference.max_tokens),
        clip_low=trainer.clip_low, clip_high=trainer.clip_high,
        dual_clip=trainer.dual_clip if trainer.loss_fn == "ppo" else None,
        correction=trainer.correction, kl_coef=trainer.kl_coef,
        kl_estimator=trainer.kl_estimator)
