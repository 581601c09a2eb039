"""The synchronous reference loop: the whole of on-policy RL for agents, in one sitting.

    repeat max_steps times:
        collect n samples of every task with the current weights   (collector, sandboxes)
        advantages within each group, trajectories -> sequences     (batch.py, algorithms/)
        forward_backward with the policy loss, then optim_step      (the backend)
        publish the new weights; pause(keep) -> update -> resume    (weight_sync, the server)

Every sample of step k is drawn by policy version k, so nothing is stale. The async loop does the
same work overlapped, and must reproduce this loop at max_staleness=0.
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
from skyrl_agent.inference.client import InferenceClient
from skyrl_agent.tasks import resolve_tasks
from skyrl_agent.trainers.backend import TrainerBackend
from skyrl_agent.trainers.batch import groups_to_batch
from skyrl_agent.trainers.settings import adam_params, check_trainable, loss_config, make_backend
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


def step_dir(output: Path, step: int) -> Path:
    """Where step `step` stores its samples: a run dir `eval` can read."""
    return output / "rollouts" / f"step-{step:05d}"


async def collect(config: RunConfig, step: int, output: Path, sessions: Any,
                  server: Any) -> list[TrajectoryGroup]:
    """Every task n times with the current weights, stored in the step's own run dir."""
    settings = config.model_copy(update={"seed": config.seed + step})
    tasks = resolve_tasks(config.tasks.source, config.tasks.include, config.tasks.limit)
    n = config.collector.n_samples_per_task
    run_dir = RunDir(step_dir(output, step))
    run_dir.prepare(record_of(settings, n))
    store = TrajectoryStore(run_dir.path, writable=True)
    try:
        collector = Collector(settings, agent_class(config.agent.name), store, sessions)
        return await supervised(collector.run(tasks, n), server)
    finally:
        store.close()


async def publish(backend: TrainerBackend, client: InferenceClient, version: int) -> float:
    """The backend's weights onto every server, between two of their decode steps; seconds."""
    update = await asyncio.to_thread(backend.save_weights_for_sampler, version)
    started = time.perf_counter()
    await client.pause("keep")
    try:
        await client.update_weights(str(update.path), update.version)
    finally:
        await client.resume()
    return update.seconds + time.perf_counter() - started


def train_on(backend: TrainerBackend, config: RunConfig,
             groups: list[TrajectoryGroup]) -> dict[str, float]:
    """One optimizer step on the groups; the step's metrics."""
    batch = groups_to_batch(groups, config.trainer.advantage)
    metrics: dict[str, float] = {"trajectories": batch.trajectories, "masked": batch.masked,
                                 "sequences": len(batch.data)}
    if not batch.data:
        log.warning("no trainable samples this step (all masked); weights unchanged")
        return metrics
    out = backend.forward_backward(batch.data, config.trainer.loss_fn, loss_config(config))
    step = backend.optim_step(adam_params(config.trainer))
    return {**metrics, **out.metrics, **step.metrics}


async def reference_loop(config: RunConfig, output: Path,
                         on_step: Callable[[StepResult], Any] = lambda r: None,
                         ) -> list[StepResult]:
    """Train for config.trainer.max_steps steps against the embedded server (or the endpoint)."""
    check_trainable(config)
    await asyncio.to_thread(output.mkdir, parents=True, exist_ok=True)
    backend = await asyncio.to_thread(make_backend, config)
    results = []
    try:
        async with model_sessions(config, output) as model:
            for step in range(config.trainer.max_steps):
                started = time.perf_counter()
                groups = await collect(config, step, output, model.sessions, model.server)
                collected = time.perf_counter()
                metrics = await asyncio.to_thread(train_on, backend, config, groups)
                trained = time.perf_counter()
                metrics["sync_s"] = await publish(backend, model.client, step + 1)
                metrics.update(collect_s=collected - started, train_s=trained - collected)
                rewards = [t.reward.value for g in groups for t in g.trajectories
                           if not t.masked]
                result = StepResult(step, sum(rewards) / max(len(rewards), 1), metrics)
                log.info("step %d: reward %.3f, %s", step, result.reward_mean,
                         ", ".join(f"{k} {v:.4g}" for k, v in sorted(metrics.items())))
                results.append(result)
                on_step(result)
    finally:
        backend.close()
    return results
