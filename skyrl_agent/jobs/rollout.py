"""A rollout job: tasks x n samples against a model server, stored in a run directory.

The model server is the embedded one, started and supervised by collector/model_access.py,
unless an endpoint is given. Trajectories go to the run's store as each finishes; the same job
on the same run directory resumes it, skipping the samples already stored.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skyrl_agent.collector.collector import Collector, missing_samples
from skyrl_agent.collector.model_access import model_sessions, supervised
from skyrl_agent.config import RunConfig
from skyrl_agent.data.store import TrajectoryStore
from skyrl_agent.jobs.prepare import ROLLOUT, prepare_run, record_of
from skyrl_agent.types import Trajectory


@dataclass(frozen=True)
class RolloutResult:
    trajectories: list[Trajectory]
    """Every trajectory of the run, stored before or now, in task order."""
    pool_hits: int
    """Samples that got a warm sandbox from the pool."""
    pool_misses: int
    """Samples that had to start one."""


class Rollout:
    """One rollout job: validated before any work (one-line errors), the store held for writing
    from construction until close()."""

    def __init__(self, settings: RunConfig, n: int, output: Path) -> None:
        self.prepared = prepare_run(settings, ROLLOUT, output, record_of(settings, n))
        self.settings = settings
        self.n = n
        assert self.prepared.run_dir and self.prepared.store is not None  # ROLLOUT opens both
        self.run_dir = self.prepared.run_dir
        self.store: TrajectoryStore = self.prepared.store
        self.tasks = list(self.prepared.tasks)
        self.pending = missing_samples(self.store, self.tasks, n)
        """The (task, sample) pairs still to run."""

    async def run(self, on_done: Callable[[Trajectory], Any]) -> RolloutResult:
        """Run every pending sample; finished trajectories are stored before `on_done` sees them."""
        agent_cls = self.prepared.agent
        async with contextlib.AsyncExitStack() as stack:
            model = None
            if self.pending and agent_cls.needs_model:  # a finished run needs no server
                model = await stack.enter_async_context(
                    model_sessions(self.settings, self.run_dir.path))
            collector = Collector(self.settings, agent_cls, self.store,
                                  model.sessions if model else None, on_done)
            groups = await supervised(collector.run(self.tasks, self.n),
                                      model.servers if model else [])
        await asyncio.to_thread(self.store.compact)  # one file for readers, not one per sample
        return RolloutResult([t for group in groups for t in group.trajectories],
                             collector.sandboxes.hits, collector.sandboxes.misses)

    def close(self) -> None:
        self.store.close()

