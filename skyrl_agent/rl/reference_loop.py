"""The synchronous reference loop: the whole of on-policy RL for agents, in one sitting.

    repeat max_steps times:
        collect the step's groups with the current weights        (collector, sandboxes)
        advantages within each group, trajectories -> sequences   (batch.py, algorithms/)
        forward_backward with the policy loss, then optim_step    (the backend)
        publish the new weights; staged, then swapped between two decode steps

Step s takes groups s*B .. s*B + B - 1 of the task stream (stream.py; B = groups_per_step) and
every one of its samples is drawn by policy version s, so nothing is stale. Trajectories go to the
run dir's store like a rollout's (`eval RUN_DIR` reads them). The async loop does the same work
overlapped, and must reproduce this loop at max_staleness=0. Both run the step in step.py on
the same parts (workers.py); jobs/train.py prepares a run and starts them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from skyrl_agent.config import RunConfig
from skyrl_agent.rl.step import StepResult, collect, publish, reward_mean, train_on
from skyrl_agent.rl.stream import TaskStream
from skyrl_agent.rl.workers import Workers
from skyrl_agent.tasks.spec import TaskSpec

log = logging.getLogger(__name__)


async def reference_loop(config: RunConfig, workers: Workers, tasks: Sequence[TaskSpec],
                         on_step: Callable[[StepResult], Any] = lambda r: None,
                         ) -> list[StepResult]:
    """Train for config.trainer.max_steps steps on `tasks` with the started `workers`."""
    stream = TaskStream(list(tasks), config.collector.n_samples_per_task, config.seed)
    per_step = config.trainer.groups_per_step or len(tasks)
    results = []
    for step in range(config.trainer.max_steps):
        started = time.perf_counter()
        slots = [stream.slot(step * per_step + i) for i in range(per_step)]
        groups = await workers.supervise(collect(workers.collector, slots))
        collected = time.perf_counter()
        metrics = await asyncio.to_thread(train_on, workers.backend, config, groups)
        trained = time.perf_counter()
        metrics["sync_s"] = await publish(workers.backend, workers.servers, step + 1)
        metrics.update(collect_s=collected - started, train_s=trained - collected)
        result = StepResult(step, reward_mean(groups), metrics)
        log.info("step %d: reward %.3f, %s", step, result.reward_mean,
                 ", ".join(f"{k} {v:.4g}" for k, v in sorted(metrics.items())))
        results.append(result)
        on_step(result)
    return results
