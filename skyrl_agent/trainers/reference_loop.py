"""The synchronous reference loop: the whole of on-policy RL for agents, in one sitting.

    repeat max_steps times:
        collect the step's groups with the current weights        (collector, sandboxes)
        advantages within each group, trajectories -> sequences   (batch.py, algorithms/)
        forward_backward with the policy loss, then optim_step    (the backend)
        publish the new weights; pause(keep) -> update -> resume  (weight_sync, the server)

Step s takes groups s*B .. s*B + B - 1 of the task stream (stream.py; B = groups_per_step) and
every one of its samples is drawn by policy version s, so nothing is stale. Trajectories go to the
run dir's store like a rollout's (`eval RUN_DIR` reads them). The async loop does the same work
overlapped, and must reproduce this loop at max_staleness=0.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skyrl_agent.agents.base import agent_class
from skyrl_agent.collector.collector import Collector
from skyrl_agent.collector.run import model_sessions, record_of, supervised
from skyrl_agent.config import RunConfig
from skyrl_agent.data.run_dir import RunDir
from skyrl_agent.data.store import TrajectoryStore
from skyrl_agent.tasks import resolve_tasks
from skyrl_agent.tasks.families import refuse_heldout
from skyrl_agent.trainers.backend import TrainerBackend
from skyrl_agent.trainers.batch import groups_to_batch
from skyrl_agent.trainers.settings import adam_params, check_trainable, loss_config, make_backend
from skyrl_agent.trainers.stream import GroupSlot, TaskStream
from skyrl_agent.trainers.workers import ServerControl
from skyrl_agent.types import TrajectoryGroup

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
    """The backend's weights onto every server, between two of their decode steps; seconds."""
    update = await asyncio.to_thread(backend.save_weights_for_sampler, version)
    started = time.perf_counter()
    await servers.pause("keep")
    try:
        await servers.update_weights(str(update.path), update.version)
    finally:
        await servers.resume()
    return update.seconds + time.perf_counter() - started


def group_metrics(groups: list[TrajectoryGroup]) -> dict[str, float]:
    """What the step's samples were: pass rate (reward 1), masked ones by failure kind, and
    how many tokens were sampled."""
    samples = [t for g in groups for t in g.trajectories]
    kept = [t for t in samples if not t.masked]
    metrics = {"pass_rate": sum(t.reward.value >= 1.0 for t in kept) / max(len(kept), 1),
               "sampled_tokens": float(sum(len(turn.completion_ids) for t in samples
                                           for s in t.segments for turn in s.turns))}
    for t in samples:
        if t.masked:
            key = f"masked/{t.failure or 'other'}"
            metrics[key] = metrics.get(key, 0.0) + 1
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
                                 "sequences": len(batch.data), **group_metrics(groups)}
    if skip:
        metrics["uniform_groups"] = uniform
    if not batch.data:
        log.warning("no trainable samples this step (all masked or uniform); weights unchanged")
        return metrics
    out = backend.forward_backward(batch.data, config.trainer.loss_fn, loss_config(config))
    step = backend.optim_step(adam_params(config.trainer))
    return {**metrics, **out.metrics, **step.metrics}


async def collect(collector: Collector, slots: list[GroupSlot]) -> list[TrajectoryGroup]:
    """The slots' groups, concurrently; in slot order."""
    return list(await asyncio.gather(
        *[collector.run_group(s.task, s.sample_indices) for s in slots]))


def reward_mean(groups: list[TrajectoryGroup]) -> float:
    rewards = [t.reward.value for g in groups for t in g.trajectories if not t.masked]
    return sum(rewards) / max(len(rewards), 1)


async def reference_loop(config: RunConfig, output: Path,
                         on_step: Callable[[StepResult], Any] = lambda r: None,
                         ) -> list[StepResult]:
    """Train for config.trainer.max_steps steps against the embedded server (or the endpoint);
    the run's trajectories are stored in `output`."""
    check_trainable(config)
    n = config.collector.n_samples_per_task
    tasks = resolve_tasks(config.tasks.source, config.tasks.include, config.tasks.limit)
    refuse_heldout((t.name for t in tasks), config.tasks.source)
    stream = TaskStream(tasks, n, config.seed)
    per_step = config.trainer.groups_per_step or len(tasks)
    await asyncio.to_thread(RunDir(output).prepare, record_of(config, n))
    store = TrajectoryStore(output, writable=True)
    backend = await asyncio.to_thread(make_backend, config)
    results = []
    try:
        async with model_sessions(config, output) as model:
            collector = Collector(config, agent_class(config.agent.name), store, model.sessions)
            try:
                for step in range(config.trainer.max_steps):
                    started = time.perf_counter()
                    slots = [stream.slot(step * per_step + i) for i in range(per_step)]
                    groups = await supervised(collect(collector, slots), model.servers)
                    collected = time.perf_counter()
                    metrics = await asyncio.to_thread(train_on, backend, config, groups)
                    trained = time.perf_counter()
                    metrics["sync_s"] = await publish(backend, model.client, step + 1)
                    metrics.update(collect_s=collected - started, train_s=trained - collected)
                    result = StepResult(step, reward_mean(groups), metrics)
                    log.info("step %d: reward %.3f, %s", step, result.reward_mean,
                             ", ".join(f"{k} {v:.4g}" for k, v in sorted(metrics.items())))
                    results.append(result)
                    on_step(result)
            finally:
                await collector.close()
    finally:
        backend.close()
        store.close()
    return results
