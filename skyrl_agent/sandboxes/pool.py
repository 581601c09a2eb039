"""A warm pool: sandboxes started ahead of need, per task environment, for any backend.

Starting a Docker container costs ~0.5 s and a local sandbox ~0.05 s; with a pool that cost moves
off the critical path. Pooled sandboxes are pristine (nothing ran in them yet) and are keyed by
the content hash of the environment, so one never serves a different task's environment.

Stopping moves off it too: `release` starts a used sandbox's stop as a task of its own (its
first step kills every process; waiting for them, unmounting and deleting follow) and `close`
waits for those tasks. A used sandbox is never handed out again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

from skyrl_agent.config import SandboxConfig
from skyrl_agent.sandboxes.base import Sandbox, SandboxError, SandboxSpec, create_sandbox

log = logging.getLogger(__name__)


class SandboxPool:
    """Keeps `size` started sandboxes per environment; `acquire` hands one out and refills."""

    def __init__(self, config: SandboxConfig, size: int, max_idle_s: float = 600.0,
                 start_timeout_s: float = 900.0, stop_in_background: bool = False,
                 limit: int | None = None) -> None:
        self.config = config
        self.size = size
        self.stop_in_background = stop_in_background
        """Whether `release` returns before the stop has finished: only for a pool whose owner
        calls `close` (which waits for those stops) before its event loop ends."""
        self._slots = asyncio.Semaphore(limit) if limit else None
        """At most `limit` sandboxes handed out at once, each counted until its stop has
        finished (idle pooled ones are not counted); None: no bound."""
        self._closed = False
        self.max_idle_s = max_idle_s
        self.start_timeout_s = start_timeout_s
        self._idle: dict[str, list[tuple[Sandbox, float]]] = {}
        self._starting: dict[str, int] = {}
        """Starts in flight per environment: counted as room taken, so that two concurrent
        refills never both start the last free place."""
        self._refills: set[asyncio.Task] = set()
        self._stops: set[asyncio.Task] = set()
        self.hits = 0
        self.misses = 0

    def _pooled_spec(self, spec: SandboxSpec) -> SandboxSpec:
        # Idle time must not eat into the sandbox's working time.
        if self.size == 0:
            return spec
        return dataclasses.replace(spec, deadline_s=spec.deadline_s + self.max_idle_s)

    async def _start(self, spec: SandboxSpec) -> Sandbox:
        sandbox = create_sandbox(self._pooled_spec(spec), self.config)
        try:
            await asyncio.wait_for(sandbox.start(), self.start_timeout_s)
        except TimeoutError:
            await asyncio.shield(sandbox.stop())
            raise SandboxError(f"start took over {self.start_timeout_s:g} s") from None
        except BaseException:
            await asyncio.shield(sandbox.stop())
            raise
        return sandbox

    async def _refill(self, key: str, spec: SandboxSpec) -> None:
        idle = self._idle.setdefault(key, [])
        while len(idle) + self._starting.get(key, 0) < self.size:
            self._starting[key] = self._starting.get(key, 0) + 1
            try:
                sandbox = await self._start(spec)
            finally:
                self._starting[key] -= 1
            idle.append((sandbox, time.monotonic()))

    def _schedule_refill(self, key: str, spec: SandboxSpec) -> None:
        task = asyncio.create_task(self._refill(key, spec))
        self._refills.add(task)
        task.add_done_callback(self._refills.discard)

    async def warm(self, spec: SandboxSpec) -> None:
        """Fill the pool for this environment now (e.g. before a run starts)."""
        await self._refill(spec.environment_key(), spec)

    async def acquire(self, spec: SandboxSpec) -> Sandbox:
        """A started sandbox for spec: a pooled one if fresh enough, else a new one (waiting
        for a slot first when the pool is bounded)."""
        if self._slots is not None:
            await self._slots.acquire()
        try:
            return await self._hand_out(spec)
        except BaseException:
            self._free_slot()
            raise

    async def acquire_spare(self, spec: SandboxSpec) -> Sandbox | None:
        """Like acquire, but only when a slot is free now and nobody waits for one (a sandbox
        started ahead of need must not hold up one needed now); else None."""
        if self._slots is not None and self._slots.locked():
            return None
        return await self.acquire(spec)

    def _free_slot(self) -> None:
        if self._slots is not None:
            self._slots.release()

    async def _hand_out(self, spec: SandboxSpec) -> Sandbox:
        key = spec.environment_key()
        idle = self._idle.setdefault(key, [])
        sandbox = None
        while idle and sandbox is None:
            candidate, since = idle.pop(0)
            if time.monotonic() - since <= self.max_idle_s:
                sandbox = candidate
            else:
                await candidate.stop()
        if sandbox is None:
            self.misses += 1
            sandbox = await self._start(spec)
        else:
            self.hits += 1
        if self.size > 0:
            self._schedule_refill(key, spec)
        return sandbox

    async def release(self, sandbox: Sandbox) -> None:
        """Stop a sandbox that was handed out (shielded: a cancelled caller still stops it), in
        a task of its own when the pool stops in the background and is not closed yet. Its slot
        is free once the stop has finished."""
        task = asyncio.create_task(self._stop(sandbox))
        if not self.stop_in_background or self._closed:
            await asyncio.shield(task)
            return
        self._stops.add(task)
        task.add_done_callback(self._stops.discard)

    async def _stop(self, sandbox: Sandbox) -> None:
        """stop(), then its slot is free. A failure is logged: a stop in the background has
        no caller to raise to."""
        try:
            await sandbox.stop()
        except Exception as exc:  # noqa: BLE001
            log.warning("stopping sandbox %s failed: %s", sandbox.spec.name, exc)
        finally:
            self._free_slot()

    async def close(self) -> None:
        """Stop refills and every idle sandbox; wait for the stops `release` left running (a
        release after this stops at once)."""
        self._closed = True
        for task in list(self._refills):
            task.cancel()
        await asyncio.gather(*self._refills, return_exceptions=True)
        for idle in self._idle.values():
            await asyncio.gather(*(s.stop() for s, _ in idle), return_exceptions=True)
        self._idle.clear()
        await asyncio.gather(*self._stops, return_exceptions=True)
