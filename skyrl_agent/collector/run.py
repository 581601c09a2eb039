"""A rollout job: tasks x n samples against a model server, stored in a run directory.

The model server is the embedded one, started and supervised here, unless an endpoint is given.
Trajectories go to the run's TrajectoryStore as each finishes; the same job on the same run
directory resumes it, skipping the samples already stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skyrl_agent.agents.base import Agent, agent_class
from skyrl_agent.agents.session import LLMSession, SessionConfig
from skyrl_agent.collector.collector import Collector, missing_samples
from skyrl_agent.collector.rollout import SessionFactory, make_agent
from skyrl_agent.config import RunConfig
from skyrl_agent.data.run_dir import RunDir, RunRecord
from skyrl_agent.data.store import TrajectoryStore
from skyrl_agent.errors import RunStopped
from skyrl_agent.inference.auth import endpoint_key, save_server_keys
from skyrl_agent.inference.client import InferenceClient
from skyrl_agent.inference.process import ServerProcess
from skyrl_agent.tasks.model import TaskSpec
from skyrl_agent.types import Trajectory

log = logging.getLogger(__name__)
SERVER_POLL_S = 0.25
"""How often a supervised server is checked: its death stops the run within this."""
PLACEMENT: dict[str, Any] = {"collector": True, "output_dir": True, "ray": True,
                             "inference": {"num_servers"}}
"""Settings that say where and how concurrently a run's parts work, not what they sample or
train: a run dir does not pin them."""


@dataclass
class ModelAccess:
    """What agents reach the model through: a session factory, the client under it (for
    pause / update_weights / resume), and the server started for them (None when the endpoint
    runs elsewhere)."""

    sessions: SessionFactory
    client: InferenceClient
    servers: list[ServerProcess]
    """The embedded servers started here (none when the endpoint runs elsewhere)."""


def record_of(settings: RunConfig, n: int) -> RunRecord:
    """What a run dir pins: what is sampled. Concurrency, where the run dir lives and how a
    trainer would use the samples may change between a run and its resumption."""
    config = json.loads(settings.model_dump_json(exclude=PLACEMENT | {"trainer": True}))
    return RunRecord(n=n, config=config)


def session_config(config: RunConfig, served_max_len: int | None) -> SessionConfig:
    """Per-session budgets from the run config, the context clamped to what the servers serve."""
    budget, inference = config.agent, config.inference
    settings = SessionConfig(
        max_context_tokens=budget.max_context_tokens, max_tokens=inference.max_tokens,
        temperature=inference.temperature, top_p=inference.top_p,
        summarize_at=budget.summarize_at, max_summaries=budget.max_summaries,
        max_sampled_tokens=budget.max_sampled_tokens)
    if budget.summary_prompt:
        settings = dataclasses.replace(settings, summary_prompt=budget.summary_prompt)
    if served_max_len and served_max_len < settings.max_context_tokens:
        settings = dataclasses.replace(settings, max_context_tokens=served_max_len)
    return settings


def session_factory(client: Any, tokenizer: Any, settings: SessionConfig) -> SessionFactory:
    """LLM sessions over `client` (an InferenceClient, or anything with its complete and
    end_session calls)."""
    def factory(agent: Agent, session_id: str) -> LLMSession:
        return LLMSession(client, tokenizer, settings, tools=agent.tools, session_id=session_id)
    return factory


def embedded_servers(config: RunConfig, run_dir: Path) -> list[ServerProcess]:
    """inference.num_servers embedded servers, not started yet."""
    from skyrl_agent.inference.process import embedded_server

    count = config.inference.num_servers
    return [embedded_server(config.inference.model,
                            log_path=RunDir(run_dir).server_log_of(i, count))
            for i in range(count)]


def start_all(servers: Sequence[ServerProcess]) -> list[str]:
    """Start the servers (they load their models at the same time); their URLs. The caller
    stops them, whatever happens."""
    for server in servers:
        server.spawn()
    return [server.wait_ready() for server in servers]


@contextlib.asynccontextmanager
async def model_sessions(config: RunConfig, run_dir: Path) -> AsyncIterator[ModelAccess]:
    """A session factory over the configured endpoint, or over embedded servers started here."""
    from transformers import AutoTokenizer

    from skyrl_agent.inference.models import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(config.inference.model))
    servers: list[ServerProcess] = []
    try:
        if config.inference.endpoint:
            urls, keys = [config.inference.endpoint], [endpoint_key()]
        else:
            servers = embedded_servers(config, run_dir)
            log.info("starting %d embedded model server(s) (%s)", len(servers),
                     config.inference.model)
            urls = await asyncio.to_thread(start_all, servers)
            keys = [server.api_key for server in servers]
            save_server_keys(run_dir, urls, keys)
            log.info("embedded model server(s) ready at %s", ", ".join(urls))
        async with InferenceClient(urls, api_keys=keys) as client:
            settings = session_config(config, await client.max_model_len())
            yield ModelAccess(session_factory(client, tokenizer, settings), client, servers)
    finally:
        for server in servers:
            await asyncio.to_thread(server.stop)


async def watched[T](work: Coroutine[Any, Any, T],
                     stopped: Callable[[], Awaitable[str | None]]) -> T:
    """Run `work` while `stopped()` finds nothing wrong. When it names a reason, `work` is
    cancelled (its sandboxes stop; finished samples are already stored) and the run stops with
    that one line."""
    task = asyncio.ensure_future(work)
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=SERVER_POLL_S)
            reason = None if task.done() else await stopped()
            if reason is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                raise RunStopped(f"{reason}; stored samples are kept: run the same command "
                                 "to resume")
        return await task
    finally:
        task.cancel()


async def supervised[T](work: Coroutine[Any, Any, T], servers: Sequence[ServerProcess]) -> T:
    """Run `work` while every server in `servers` lives (see `watched`)."""
    async def stopped() -> str | None:
        for server in servers:
            if not server.running:
                return (f"the model server exited (status {server.returncode}; its log: "
                        f"{server.log_path})")
        return None
    return await watched(work, stopped)


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
        from skyrl_agent.sandboxes.base import preflight, sandbox_backend
        from skyrl_agent.sandboxes.reaper import reap_leftovers
        from skyrl_agent.tasks import resolve_tasks

        self.settings = settings
        self.n = n
        self.run_dir = RunDir(output)
        self.agent_cls = agent_class(settings.agent.name)
        make_agent(self.agent_cls, settings)  # a broken constructor fails before any work
        sandbox_backend(settings.sandbox.backend)
        self.tasks: list[TaskSpec] = resolve_tasks(
            settings.tasks.source, settings.tasks.include, settings.tasks.limit)
        preflight(self.tasks, settings.sandbox)
        self.run_dir.prepare(record_of(settings, n))
        self.store = TrajectoryStore(output, writable=True)
        reap_leftovers(settings.sandbox)
        self.pending = missing_samples(self.store, self.tasks, n)
        """The (task, sample) pairs still to run."""

    async def run(self, on_done: Callable[[Trajectory], Any]) -> RolloutResult:
        """Run every pending sample; finished trajectories are stored before `on_done` sees them."""
        async with contextlib.AsyncExitStack() as stack:
            model = None
            if self.pending and self.agent_cls.needs_model:  # a finished run needs no server
                model = await stack.enter_async_context(
                    model_sessions(self.settings, self.run_dir.path))
            collector = Collector(self.settings, self.agent_cls, self.store,
                                  model.sessions if model else None, on_done)
            groups = await supervised(collector.run(self.tasks, self.n),
                                      model.servers if model else [])
        await asyncio.to_thread(self.store.compact)  # one file for readers, not one per sample
        return RolloutResult([t for group in groups for t in group.trajectories],
                             collector.sandboxes.hits, collector.sandboxes.misses)

    def close(self) -> None:
        self.store.close()
