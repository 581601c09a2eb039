"""The task stream: every task once per epoch, a seeded order, unique sample indices."""

from __future__ import annotations

import pytest

from skyrl_agent.rl.stream import TaskStream
from skyrl_agent.tasks.spec import TaskSpec


@pytest.fixture(scope="module")
def tasks() -> list[TaskSpec]:
    from skyrl_agent.tasks import resolve_tasks
    return resolve_tasks("demo", [], 5)


def test_each_epoch_visits_every_task_once_in_a_seeded_order(tasks):
    stream = TaskStream(tasks, n=3, seed=7)
    epochs = [[stream.slot(e * 5 + i).task.name for i in range(5)] for e in range(3)]
    assert all(sorted(epoch) == sorted(t.name for t in tasks) for epoch in epochs)
    assert len({tuple(e) for e in epochs}) > 1  # reshuffled each epoch
    again = TaskStream(tasks, n=3, seed=7)
    assert [again.slot(p).task.name for p in range(15)] == [e for ep in epochs for e in ep]
    other = TaskStream(tasks, n=3, seed=8)
    assert [other.slot(p).task.name for p in range(15)] != [e for ep in epochs for e in ep]


def test_sample_indices_are_unique_per_task_across_epochs(tasks):
    stream = TaskStream(tasks, n=3, seed=0)
    seen = set()
    for position in range(20):
        slot = stream.slot(position)
        assert slot.epoch == position // 5 and slot.position == position
        for index in slot.sample_indices:
            assert (slot.task.name, index) not in seen
            seen.add((slot.task.name, index))
    assert len(seen) == 60


def test_a_stream_needs_tasks():
    with pytest.raises(ValueError, match="at least one task"):
        TaskStream([], 2, 0)
