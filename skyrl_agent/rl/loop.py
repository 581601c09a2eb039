"""The asynchronous training loop: sampling and training overlap, within a staleness bound.

Groups are drawn from the task stream and sampled while the trainer trains. Admission control
(after AReaL): at most (max_staleness + 1) x groups_per_step groups are running or waiting to be
trained, and a consumed group frees its place only once the weights trained on it are published.
So a group admitted at version v is normally trained by step v + max_staleness. What still breaks
the bound (a slow group overtaken by faster ones) is dropped and counted at batch time, never
trained: staleness = the trainer's version - the oldest version among the group's tokens.
Groups of impossible twins (tasks.impossible_twins) are counted, never trained: the share of
their samples that earned a reward is the step's `hacks/impossible_twin_rate`.

After each step the weights go to every server, which stages them beside decoding and swaps them
in between two decode steps: running turns continue with the new weights and their tokens carry
the new version.
At max_staleness = 0 nothing is admitted until the new weights are published: this is the
reference loop, step for step.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from skyrl_agent.backends.backend import TrainerBackend
from skyrl_agent.config import RunConfig
from skyrl_agent.errors import RunStopped
from skyrl_agent.rl.checkpoints import LoopState
from skyrl_agent.rl.step import StepResult, publish, reward_mean, train_on
from skyrl_agent.rl.stream import GroupSlot, TaskStream
from skyrl_agent.rl.workers import GroupSource, ServerControl
from skyrl_agent.tasks.spec import is_impossible_twin
from skyrl_agent.types import TrajectoryGroup

log = logging.getLogger(__name__)


def oldest_version(group: TrajectoryGroup) -> int | None:
    """The oldest policy version among the group's sampled tokens (None: nothing sampled)."""
    versions = [min(turn.token_policy_versions or (turn.policy_version,))
                for t in group.trajectories if not t.masked
                for segment in t.segments for turn in segment.turns if turn.completion_ids]
    return min(versions, default=None)


@dataclass
class _Outstanding:
    """Groups admitted and not yet released (running, ready, or trained but unpublished)."""

    running: dict[int, asyncio.Task[TrajectoryGroup]] = field(default_factory=dict)
    ready: dict[int, TrajectoryGroup] = field(default_factory=dict)
    held: int = 0
    """Groups consumed by the step in progress: they free their places once it publishes."""

    def __len__(self) -> int:
        return len(self.running) + len(self.ready) + self.held


class AsyncLoop:
    """One training run's main loop over a collector, a backend and the inference servers."""

    def __init__(self, config: RunConfig, backend: TrainerBackend, collector: GroupSource,
                 servers: ServerControl, stream: TaskStream, state: LoopState,
                 on_step: Callable[[StepResult], Any] = lambda r: None,
                 on_checkpoint: Callable[[LoopState], Awaitable[Any]] | None = None) -> None:
        self.config = config
        self.backend = backend
        self.collector = collector
        self.servers = servers
        self.stream = stream
        self.state = state
        self.on_step = on_step
        self.on_checkpoint = on_checkpoint
        self.max_staleness = config.trainer.max_staleness
        self.per_step = config.trainer.groups_per_step or len(stream.tasks)
        self.capacity = (self.max_staleness + 1) * self.per_step
        self._outstanding = _Outstanding()
        self._changed = asyncio.Event()
        self._queue = list(state.pending())  # admitted before a restart, never finished
        self._dropped_this_step = 0
        self._step_staleness: list[int] = []
        self._twin_rewards: list[float] = []
        self._fail: BaseException | None = None
        self._last_step_end = time.perf_counter()
        self._last_busy_s = 0.0

    async def run(self) -> list[StepResult]:
        results = []
        producer = asyncio.create_task(self._produce())
        try:
            while self.state.step < self.config.trainer.max_steps:
                results.append(await self._step())
        finally:
            producer.cancel()
            running = list(self._outstanding.running.values())
            for task in running:
                task.cancel()
            await asyncio.gather(producer, *running, return_exceptions=True)
        return results

    # ---- producing -----------------------------------------------------------------------

    async def _produce(self) -> None:
        while True:
            while len(self._outstanding) >= self.capacity:
                await self._wait_for_change()
            if self._queue:
                position = self._queue.pop(0)
            else:
                position = self.state.next_position
                self.state.next_position += 1
            self._start(self.stream.slot(position))

    def _start(self, slot: GroupSlot) -> None:
        task = asyncio.create_task(self.collector.run_group(slot.task, slot.sample_indices))
        self._outstanding.running[slot.position] = task
        task.add_done_callback(functools.partial(self._finished, slot.position))

    def _finished(self, position: int, task: asyncio.Task[TrajectoryGroup]) -> None:
        self._outstanding.running.pop(position, None)
        if task.cancelled():
            return
        failure = task.exception()
        if failure is not None:
            if not isinstance(failure, RunStopped):  # a stop is told once, in one line, by main
                log.error("group %d failed", position, exc_info=failure)
            self._fail = failure
        else:
            self._outstanding.ready[position] = task.result()
        self._notify()

    def _notify(self) -> None:
        self._changed.set()

    async def _wait_for_change(self) -> None:
        await self._changed.wait()
        self._changed.clear()

    # ---- training ------------------------------------------------------------------------

    async def _batch(self) -> list[TrajectoryGroup]:
        """The next groups_per_step groups within the bound, lowest positions first; stale ones
        are dropped on the way."""
        batch: list[TrajectoryGroup] = []
        version = self.backend.step
        while len(batch) < self.per_step:
            if isinstance(self._fail, RunStopped):  # a part the run needs is gone
                raise self._fail
            if self._fail is not None:
                raise RuntimeError("a group failed to collect") from self._fail
            if not self._outstanding.ready:
                await self._wait_for_change()
                continue
            position = min(self._outstanding.ready)
            group = self._outstanding.ready.pop(position)
            if is_impossible_twin(group.task_id):  # a hack measure, never a lesson
                self.state.twins.append(position)
                self._twin_rewards += [t.reward.value for t in group.trajectories
                                       if not t.masked]
                self._notify()
                continue
            oldest = oldest_version(group)
            staleness = version - oldest if oldest is not None else 0
            if staleness > self.max_staleness or staleness < 0:
                # Too old for the bound, or (after a restart) sampled by weights the restored
                # checkpoint never had: never trained, counted.
                self.state.dropped.append(position)
                self._dropped_this_step += 1
                self._notify()
                continue
            self._step_staleness.append(staleness)
            self.state.trained.append(position)
            self._outstanding.held += 1
            batch.append(group)
        return batch

    def _twin_metrics(self) -> dict[str, float]:
        """The impossible twins counted since the last step: how many samples, and the share
        that earned a reward (each one a forged reward); a warning line when any did."""
        rewards, self._twin_rewards = self._twin_rewards, []
        if not rewards:
            return {}
        hacked = sum(value > 0 for value in rewards)
        if hacked:
            log.warning("step %d: %d of %d samples of impossible twins earned a reward: the "
                        "policy is forging rewards (hacks/impossible_twin_rate)",
                        self.backend.step - 1, hacked, len(rewards))
        return {"hacks/impossible_twins": float(len(rewards)),
                "hacks/impossible_twin_rate": hacked / len(rewards)}

    async def _step(self) -> StepResult:
        started = time.perf_counter()
        groups = await self._batch()
        waited = time.perf_counter() - started
        metrics = await asyncio.to_thread(train_on, self.backend, self.config, groups)
        trained = time.perf_counter()
        metrics["sync_s"] = await publish(self.backend, self.servers, self.backend.step)
        self._outstanding.held = 0
        self._notify()
        self.state.step = self.backend.step
        train_s = trained - started - waited
        since_last = time.perf_counter() - self._last_step_end
        self._last_step_end = time.perf_counter()
        busy_s = await self.servers.busy_seconds()
        metrics["generation_idle"] = max(0.0, 1 - (busy_s - self._last_busy_s) / since_last)
        self._last_busy_s = busy_s
        metrics["sampled_tokens_per_s"] = metrics.get("sampled_tokens", 0.0) / since_last
        metrics.update(wait_s=waited, train_s=train_s,
                       trained_tokens_per_s=metrics.get("tokens", 0.0) / max(train_s, 1e-9),
                       trainer_idle=waited / max(time.perf_counter() - started, 1e-9),
                       dropped_stale=self._dropped_this_step,
                       staleness_max=max(self._step_staleness, default=0),
                       staleness_mean=sum(self._step_staleness) / max(
                           len(self._step_staleness), 1))
        metrics.update(self._twin_metrics())
        self._dropped_this_step = 0
        self._step_staleness = []
        result = StepResult(self.state.step - 1, reward_mean(groups), metrics)
        self.on_step(result)
        if self.on_checkpoint is not None:
            await self.on_checkpoint(self.state)
        return result
