"""Which task each group of a training run samples: epochs of a seeded shuffle.

Position p of the stream is the run's p-th group. Epoch e = p // len(tasks) visits every task
once, in an order shuffled by (seed, e); its groups take sample indices e*n .. e*n + n - 1, so a
(task, sample index) pair is unique across the run and names one stored trajectory. A position
is all a checkpoint needs to record ("the data position"): the stream is a pure function of it.

With a twin rate r > 0, a seeded coin per position gives about r of the groups the task's
impossible twin instead (tasks/spec.py: same instruction, tests no honest work passes), a live
measure of reward hacking; the loop never trains on them.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from skyrl_agent.tasks.spec import TaskSpec, impossible_twin


@dataclass(frozen=True)
class GroupSlot:
    """One group of the run."""

    position: int
    """Its place in the stream (0, 1, 2, ...)."""
    task: TaskSpec
    epoch: int
    sample_indices: range
    """The n sample indices this group takes."""


class TaskStream:
    """Groups by position: deterministic, so a resumed run draws what it would have drawn."""

    def __init__(self, tasks: Sequence[TaskSpec], n: int, seed: int,
                 twin_rate: float = 0.0) -> None:
        if not tasks:
            raise ValueError("a task stream needs at least one task")
        self.tasks = list(tasks)
        self.n = n
        self.seed = seed
        self.twin_rate = twin_rate
        self.twins = [impossible_twin(task) if twin_rate else None for task in self.tasks]

    @lru_cache(maxsize=4)  # noqa: B019 - a stream lives as long as its run
    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self.tasks)))
        random.Random(f"{self.seed}/{epoch}").shuffle(order)
        return order

    def slot(self, position: int) -> GroupSlot:
        epoch, offset = divmod(position, len(self.tasks))
        index = self._order(epoch)[offset]
        task = self.tasks[index]
        twin = self.twins[index]
        if twin is not None and random.Random(f"{self.seed}/twin/{position}").random() < \
                self.twin_rate:
            task = twin
        return GroupSlot(position, task, epoch, range(epoch * self.n, (epoch + 1) * self.n))
