"""Group commit of finished trajectories: one store write for all that finish together.

A store append is one shard and three fsyncs (the shard, its folder, the index), tens of ms on a
busy disk, and appends of one store run one at a time. Samples of a group tend to finish
together, so one write per trajectory queues them behind each other. Here a trajectory that
finishes while a write is running joins the next write, with every other one that finishes
meanwhile. The guarantee stays what a plain append gives: `append` returns only once its
trajectory is durably in the store, and raises what the write raised.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Protocol

from skyrl_agent.types import Trajectory


class AppendSink(Protocol):
    """A store (or a client of one) that writes a list of trajectories durably, at once."""

    def append(self, trajectories: list[Trajectory]) -> Path | None: ...


class GroupCommit:
    """Appends to `sink`, batched: at most one write runs; whatever waits joins the next."""

    def __init__(self, sink: AppendSink) -> None:
        self.sink = sink
        self._waiting: list[tuple[Trajectory, asyncio.Future[None]]] = []
        self._writer: asyncio.Task[None] | None = None
        self.writes = 0
        """How many store writes were made (a measure of the batching)."""

    async def append(self, trajectory: Trajectory) -> None:
        """Return once `trajectory` is durably stored."""
        stored: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((trajectory, stored))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_waiting())
        await asyncio.shield(stored)  # a cancelled caller's trajectory is written all the same

    async def _write_waiting(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, []
            try:
                await asyncio.to_thread(self.sink.append, [t for t, _ in batch])
            except asyncio.CancelledError:  # the loop is closing: nobody waits any more
                for _, stored in [*batch, *self._waiting]:
                    stored.cancel()
                raise
            except Exception as exc:  # noqa: BLE001 - each waiting caller raises it
                outcome: BaseException | None = exc
            else:
                outcome = None
            self.writes += 1
            for _, stored in batch:
                if stored.done():
                    continue
                if outcome is None:
                    stored.set_result(None)
                else:
                    stored.set_exception(outcome)
