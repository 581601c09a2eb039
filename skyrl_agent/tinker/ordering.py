"""Per-model order: a training client numbers its requests (`seq_id` 1, 2, ...) and sends the
next before the previous finished, the chunks of one forward_backward even in parallel with the
first chunk last. Requests run one at a time, in seq_id order.

A request waits for its predecessors; if a seq_id never arrives (a client that failed before
sending it), the lowest waiting one goes ahead after `gap_timeout_s`, so one lost request cannot
stall a model for ever. Requests without a seq_id run in arrival order between numbered ones.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


class SeqOrder:
    """Runs jobs one at a time in seq_id order."""

    def __init__(self, next_seq: int = 1, gap_timeout_s: float = 30.0) -> None:
        self.next_seq = next_seq
        """The seq_id expected next."""
        self.gap_timeout_s = gap_timeout_s
        self._waiting: set[int] = set()
        self._changed = asyncio.Condition()
        self._running = asyncio.Lock()

    async def run[T](self, seq_id: int | None, job: Callable[[], Awaitable[T]]) -> T:
        if seq_id is None:
            async with self._running:
                return await job()
        async with self._changed:
            self._waiting.add(seq_id)
            try:
                await self._wait_for_turn(seq_id)
            finally:
                self._waiting.discard(seq_id)
        try:
            async with self._running:
                return await job()
        finally:
            async with self._changed:
                self.next_seq = max(self.next_seq, seq_id + 1)
                self._changed.notify_all()

    async def _wait_for_turn(self, seq_id: int) -> None:
        while seq_id > self.next_seq:
            try:
                await asyncio.wait_for(self._changed.wait(), self.gap_timeout_s)
            except TimeoutError:
                if seq_id == min(self._waiting):
                    log.warning("seq_id %d never arrived; running %d", self.next_seq, seq_id)
                    self.next_seq = seq_id
                    return
