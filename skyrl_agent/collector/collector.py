"""The Collector: tasks x n rollouts, concurrent, pipelined, crash-safe, in groups of n.

Each sample is one coroutine that starts its sandbox, runs the agent and verifies, so the phases
of different samples overlap instead of running phase by phase. Bounds: live sandboxes
(`max_concurrent_sandboxes`) and model calls in flight (`max_inflight_requests`). A finished
trajectory is in the store (fsynced; those finishing together in one write: appends.py) before
anyone else sees it; a resumed run skips the samples the store already holds.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from skyrl_agent.agents.base import Agent
from skyrl_agent.collector.appends import GroupCommit
from skyrl_agent.collector.one_sample import SessionFactory, make_agent, run_rollout
from skyrl_agent.collector.policy import FailurePolicy
from skyrl_agent.config import RunConfig
from skyrl_agent.data.run_dir import RunDir
from skyrl_agent.data.store import StoreContents, TrajectoryStore
from skyrl_agent.llm.session import LLMSession
from skyrl_agent.sandboxes.pool import SandboxPool
from skyrl_agent.tasks.spec import TaskSpec
from skyrl_agent.types import Trajectory, TrajectoryGroup


class TrajectorySink(Protocol):
    """What the collector needs of its store: a TrajectoryStore, or a client of one that lives
    in another process (the single writer of a distributed run)."""

    run_dir: Path

    def load(self) -> StoreContents: ...

    def append(self, trajectories: list[Trajectory]) -> Path | None: ...


_heap_frozen = False


def _freeze_startup_heap() -> None:
    """Once per process: what is alive when the first collector is made (modules, tokenizer,
    model; about 10^6 objects with torch and transformers) lives as long as the process, so
    full garbage collections skip it. Each one that did not stalled every agent's event loop
    for about 0.2 s on 2 cores. Later objects are collected as before."""
    global _heap_frozen
    if not _heap_frozen:
        _heap_frozen = True
        gc.freeze()


class Collector:
    """Runs rollouts into a TrajectoryStore and hands out complete groups."""

    def __init__(self, config: RunConfig, agent_cls: type[Agent], store: TrajectorySink,
                 sessions: SessionFactory | None = None,
                 on_trajectory: Callable[[Trajectory], Any] = lambda t: None,
                 on_group: Callable[[TrajectoryGroup], Any] = lambda g: None) -> None:
        self.config = config
        self.agent_cls = agent_cls
        self.store = store
        self.policy = FailurePolicy(config.collector)
        self.on_trajectory = on_trajectory
        self.on_group = on_group
        self._sandboxes = asyncio.Semaphore(config.collector.max_concurrent_sandboxes)
        self._requests = asyncio.Semaphore(config.collector.max_inflight_requests)
        self._sessions = self._bounded(sessions) if sessions else None
        self.sandboxes = SandboxPool(config.sandbox, size=config.sandbox.warm_pool,
                                     start_timeout_s=config.collector.sandbox_start_timeout_s,
                                     stop_in_background=True,
                                     limit=config.collector.max_concurrent_sandboxes)
        """Where samples get their sandboxes: the warm pool (size 0 = a fresh one each)."""
        self._stored: dict[tuple[str, int], Trajectory] | None = None
        self._appends = GroupCommit(store)
        _freeze_startup_heap()

    def _bounded(self, sessions: SessionFactory) -> SessionFactory:
        def factory(agent: Agent, session_id: str) -> LLMSession:
            session = sessions(agent, session_id)
            session.limiter = self._requests
            return session
        return factory

    async def run(self, tasks: list[TaskSpec], n: int) -> list[TrajectoryGroup]:
        """Every task n times (skipping stored samples); returns the groups in task order."""
        try:
            groups = await asyncio.gather(*[self.run_group(task, range(n)) for task in tasks])
        finally:
            await self.close()
        return list(groups)

    async def run_group(self, task: TaskSpec, indices: Sequence[int]) -> TrajectoryGroup:
        """The samples `indices` of one task, as a group; samples the store already holds are
        read back, not run again."""
        if self._stored is None:
            self._stored = await stored_samples(self.store)
        stored = self._stored

        async def sample(index: int) -> Trajectory:
            if (task.name, index) in stored:
                return stored[(task.name, index)]
            return await self._sample(task, index)

        trajectories = await asyncio.gather(*[sample(i) for i in indices])
        group = self.policy.group(task.name, list(trajectories))
        self.on_group(group)
        return group

    async def close(self) -> None:
        """Stop the warm sandboxes (shielded: a cancelled run still stops them)."""
        await asyncio.shield(self.sandboxes.close())

    async def _sample(self, task: TaskSpec, index: int) -> Trajectory:
        retries = 0
        while True:
            async with self._sandboxes:
                agent = make_agent(self.agent_cls, self.config)
                trajectory = await run_rollout(
                    task, index, agent, self.config, self._sessions,
                    keep_state=RunDir(self.store.run_dir).state_path(task.name, index),
                    sandboxes=self.sandboxes)
            if not self.policy.should_retry(trajectory, retries):
                break
            retries += 1
        trajectory = self.policy.finalize(trajectory, retries)
        await self._appends.append(trajectory)  # on disk before handed on
        self.on_trajectory(trajectory)
        return trajectory


async def stored_samples(store: TrajectorySink) -> dict[tuple[str, int], Trajectory]:
    """What the store already holds, by (task, sample index): a resumed run's done samples."""
    contents = await asyncio.to_thread(store.load)
    return {(t.task_id, t.sample_index): t for t in contents.trajectories}


def missing_samples(store: TrajectoryStore, tasks: list[TaskSpec], n: int,
                    ) -> list[tuple[TaskSpec, int]]:
    """The (task, sample) pairs the store does not hold yet."""
    done = store.keys()
    return [(t, i) for t in tasks for i in range(n) if (t.name, i) not in done]
