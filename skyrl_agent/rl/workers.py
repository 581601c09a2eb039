"""Where a training run's parts work: in this process (jobs/placement.py, the default), or as
Ray actors (`skyrl_agent.distributed`). The loop sees the same four things either way: a trainer
backend, a source of trajectory groups, the inference servers' controls, and a supervisor that
stops the run when a part it depends on dies.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from skyrl_agent.agents.base import Agent
from skyrl_agent.config import RunConfig
from skyrl_agent.model.weights.transport import WeightSender, WeightUpdate
from skyrl_agent.tasks.spec import TaskSpec
from skyrl_agent.types import TrajectoryGroup

if TYPE_CHECKING:  # a Ray collector or router process imports this module without torch
    from skyrl_agent.backends.backend import TrainerBackend


class GroupSource(Protocol):
    """Runs the samples of one task as a group (stored before it is returned)."""

    async def run_group(self, task: TaskSpec, indices: Sequence[int]) -> TrajectoryGroup: ...


class ServerControl(WeightSender, Protocol):
    """The inference servers, as the trainer drives them (every call reaches every server)."""

    async def pause(self, mode: str = "keep") -> None: ...

    async def resume(self) -> None: ...

    async def send(self, update: WeightUpdate) -> list[float]:
        """Every server serves `update`'s weights from one of its decode steps on (see
        `model.weights.transport.WeightSender`); each server's seconds."""
        ...

    async def busy_seconds(self) -> float:
        """Seconds so far during which some generation was in flight."""
        ...


Supervisor = Callable[[Coroutine[Any, Any, Any]], Awaitable[Any]]
"""Runs the loop's coroutine; stops it with a RunStopped line when a part it needs dies."""


@dataclass(frozen=True)
class Workers:
    """A training run's parts, started and ready."""

    backend: TrainerBackend
    collector: GroupSource
    servers: ServerControl
    supervise: Supervisor


Placement = Callable[[RunConfig, Path, type[Agent]], AbstractAsyncContextManager[Workers]]
"""Starts a run's parts for (config, run dir, agent class) and stops them on exit."""
