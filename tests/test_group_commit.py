"""Group commit of finished trajectories: those that finish while a write runs share the next
write, and each caller still returns only once its own trajectory is durably stored."""

from __future__ import annotations

import asyncio
import threading

import pytest

from skyrl_agent.collector.appends import GroupCommit
from skyrl_agent.data.store import TrajectoryStore
from tests.test_store import make_trajectory


class SlowStore:
    """A real store whose writes take a while (a busy disk) and may be told to fail."""

    def __init__(self, store: TrajectoryStore, fail_first: bool = False) -> None:
        self.store, self.fail_next = store, fail_first
        self.batches: list[int] = []
        self.release = threading.Event()

    def append(self, trajectories):
        self.release.wait(10)
        self.batches.append(len(trajectories))
        if self.fail_next:
            self.fail_next = False
            raise OSError("disk full")
        return self.store.append(trajectories)


async def test_trajectories_that_finish_during_a_write_share_the_next_one(tmp_path):
    store = TrajectoryStore(tmp_path, writable=True)
    sink = SlowStore(store)
    commits = GroupCommit(sink)
    first = asyncio.create_task(commits.append(make_trajectory("demo/a", 0)))
    await asyncio.sleep(0.05)  # the first write is running (held by the sink)
    rest = [asyncio.create_task(commits.append(make_trajectory("demo/a", i))) for i in (1, 2, 3)]
    await asyncio.sleep(0.05)
    assert not any(task.done() for task in [first, *rest])  # nobody returns before its write
    sink.release.set()
    await asyncio.gather(first, *rest)
    assert sink.batches == [1, 3] and commits.writes == 2
    assert store.keys() == {("demo/a", i) for i in range(4)}
    store.close()


async def test_a_failed_write_raises_in_each_of_its_callers_and_later_ones_are_written(tmp_path):
    store = TrajectoryStore(tmp_path, writable=True)
    sink = SlowStore(store, fail_first=True)
    commits = GroupCommit(sink)
    sink.release.set()
    failed = await asyncio.gather(commits.append(make_trajectory("demo/a", 0)),
                                  return_exceptions=True)
    assert isinstance(failed[0], OSError)
    await commits.append(make_trajectory("demo/a", 1))
    assert store.keys() == {("demo/a", 1)}
    store.close()


async def test_a_caller_cancelled_while_waiting_still_has_its_trajectory_written(tmp_path):
    store = TrajectoryStore(tmp_path, writable=True)
    sink = SlowStore(store)
    commits = GroupCommit(sink)
    waiting = asyncio.create_task(commits.append(make_trajectory("demo/a", 0)))
    await asyncio.sleep(0.05)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    sink.release.set()
    await commits.append(make_trajectory("demo/a", 1))
    assert store.keys() == {("demo/a", 0), ("demo/a", 1)}
    store.close()
