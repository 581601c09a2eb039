"""`skyrl-agent rollout`: tasks x n rollouts against a model server, stored in a run directory.

The model server is the embedded one, started here, unless an endpoint is given. Trajectories go
to the run's TrajectoryStore as each finishes; running the same command again on the same run
directory resumes it, skipping the samples already stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from skyrl_agent.agents.base import Agent
from skyrl_agent.agents.session import LLMSession, SessionConfig
from skyrl_agent.collector.collector import Collector, missing_samples
from skyrl_agent.collector.rollout import SessionFactory
from skyrl_agent.collector.store import TrajectoryStore
from skyrl_agent.config import RunConfig, load_config
from skyrl_agent.errors import UserError
from skyrl_agent.inference.client import InferenceClient
from skyrl_agent.types import Trajectory, TrajectoryGroup

CONFIG_FILE = "config.json"


def prepare_run_dir(path: Path, settings: RunConfig, n: int) -> None:
    """Create a run dir, or check that an existing one was made by the same settings (resume)."""
    # Concurrency may change between a run and its resumption; what is sampled may not.
    record = {"n": n, "config": json.loads(settings.model_dump_json(exclude={"collector"}))}
    config_path = path / CONFIG_FILE
    if config_path.exists():
        try:
            before = json.loads(config_path.read_text())
        except ValueError:
            raise UserError(f"{config_path} is corrupted; choose another --output") from None
        if before != record:
            raise UserError(f"{path} holds a run with other settings; resume it with the same "
                            "command or choose another --output")
        return
    path.mkdir(parents=True, exist_ok=True)
    config_path.write_text(json.dumps(record, indent=2))


@contextlib.asynccontextmanager
async def model_sessions(config: RunConfig, run_dir: Path) -> AsyncIterator[SessionFactory]:
    """A session factory over the configured endpoint, or over an embedded server started here."""
    from transformers import AutoTokenizer

    from skyrl_agent.inference.models import resolve_model
    from skyrl_agent.inference.process import embedded_server

    inference = config.inference
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(inference.model))
    server = None
    urls = [inference.endpoint] if inference.endpoint else []
    if not urls:
        server = embedded_server(inference.model, log_path=run_dir / "server.log")
        urls = [await asyncio.to_thread(server.start)]
    budget = config.agent
    session_config = SessionConfig(
        max_context_tokens=budget.max_context_tokens, max_tokens=inference.max_tokens,
        temperature=inference.temperature, top_p=inference.top_p,
        summarize_at=budget.summarize_at, max_summaries=budget.max_summaries,
        **({"summary_prompt": budget.summary_prompt} if budget.summary_prompt else {}))
    try:
        async with InferenceClient(urls) as client:
            served = await client.max_model_len()
            if served and served < session_config.max_context_tokens:
                session_config = dataclasses.replace(session_config, max_context_tokens=served)

            def factory(agent: Agent, session_id: str) -> LLMSession:
                return LLMSession(client, tokenizer, session_config, tools=agent.tools,
                                  session_id=session_id)
            yield factory
    finally:
        if server is not None:
            await asyncio.to_thread(server.stop)


def rollout_command(config_path: Path | None, overrides: list[str], n: int, output: Path,
                    run_with_progress: Callable[..., list[Trajectory]],
                    ) -> list[Trajectory]:
    """Validate everything first (one-line errors), then run with a progress display."""
    from skyrl_agent.agents.base import agent_class
    from skyrl_agent.sandboxes.base import sandbox_backend
    from skyrl_agent.sandboxes.reaper import reap_leftovers
    from skyrl_agent.tasks import resolve_tasks

    settings = load_config(config_path, overrides)
    agent_cls = agent_class(settings.agent.name)
    sandbox_backend(settings.sandbox.backend)
    tasks = resolve_tasks(settings.tasks.source, settings.tasks.include, settings.tasks.limit)
    prepare_run_dir(output, settings, n)
    store = TrajectoryStore(output, writable=True)
    reap_leftovers(settings.sandbox)

    pending = missing_samples(store, tasks, n)

    async def run(on_done: Callable[[Trajectory], Any]) -> list[Trajectory]:
        async def collect(sessions: SessionFactory | None) -> list[TrajectoryGroup]:
            return await Collector(settings, agent_cls, store, sessions, on_done).run(tasks, n)

        if pending and agent_cls.needs_model:  # no server needed to finish a finished run
            async with model_sessions(settings, output) as sessions:
                groups = await collect(sessions)
        else:
            groups = await collect(None)
        return [t for group in groups for t in group.trajectories]

    try:
        trajectories = run_with_progress(run, len(pending))
        store.compact()  # one shard per trajectory while running; one file for readers after
        return trajectories
    finally:
        store.close()
