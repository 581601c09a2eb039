"""The default placement of a training run: every part in this process, the embedded servers
as its subprocesses (the Ray placement lives in skyrl_agent.distributed)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

from skyrl_agent.agents.base import Agent
from skyrl_agent.backends.build import make_backend
from skyrl_agent.collector.collector import Collector, TrajectorySink
from skyrl_agent.collector.model_access import model_sessions, supervised
from skyrl_agent.collector.one_sample import SessionFactory
from skyrl_agent.config import RunConfig
from skyrl_agent.data.store import TrajectoryStore
from skyrl_agent.rl.workers import Workers

if TYPE_CHECKING:
    from skyrl_agent.harbor.relay_collector import RelayedCollector


@contextlib.asynccontextmanager
async def local_workers(config: RunConfig, run_dir: Path, agent_cls: type[Agent],
                        ) -> AsyncIterator[Workers]:
    """Every part in this process, the embedded servers as its subprocesses."""
    store = TrajectoryStore(run_dir, writable=True)
    backend = await asyncio.to_thread(make_backend, config)
    try:
        async with model_sessions(config, run_dir) as model:
            collector = _collector(config, agent_cls, store, model.sessions)
            try:
                yield Workers(backend, collector, model.client,
                              functools.partial(supervised, servers=model.servers))
            finally:
                await collector.close()
    finally:
        backend.close()
        store.close()


def _collector(config: RunConfig, agent_cls: type[Agent], store: TrajectorySink,
               sessions: SessionFactory) -> Collector | RelayedCollector:
    """Our collector, or for a Harbor agent (`harbor:NAME`) the one whose samples are Harbor
    jobs run through its relay."""
    from skyrl_agent.harbor.relay_collector import RelayedCollector, RelayedHarborAgent

    if issubclass(agent_cls, RelayedHarborAgent):
        return RelayedCollector(config, agent_cls, store, sessions)
    return Collector(config, agent_cls, store, sessions)
