"""`skyrl-agent rollout`: tasks x n rollouts against a model server, written to a run directory.

The model server is the embedded one, started here, unless an endpoint is given. Trajectories
are appended to RUN_DIR/trajectories.jsonl as each finishes (the collector issue replaces this
with the durable Parquet store).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from skyrl_agent.agents.base import Agent
from skyrl_agent.agents.session import LLMSession, SessionConfig
from skyrl_agent.collector.records import to_plain
from skyrl_agent.collector.rollout import SessionFactory, make_agent, run_rollout
from skyrl_agent.config import RunConfig, load_config
from skyrl_agent.errors import UserError
from skyrl_agent.inference.client import InferenceClient
from skyrl_agent.tasks.model import TaskSpec
from skyrl_agent.types import Trajectory

TRAJECTORIES = "trajectories.jsonl"


def prepare_run_dir(path: Path) -> Path:
    if (path / TRAJECTORIES).exists():
        raise UserError(f"{path} already holds trajectories; choose another --output")
    path.mkdir(parents=True, exist_ok=True)
    return path


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


async def rollout_all(tasks: list[TaskSpec], n: int, agent_cls: type[Agent], config: RunConfig,
                      run_dir: Path, concurrency: int, sessions: SessionFactory | None,
                      on_done: Callable[[Trajectory], Any] = lambda t: None) -> list[Trajectory]:
    """Run every task n times, at most `concurrency` at once, appending each result to disk."""
    limit = asyncio.Semaphore(concurrency)
    out_path = run_dir / TRAJECTORIES

    async def one(task: TaskSpec, index: int) -> Trajectory:
        async with limit:
            trajectory = await run_rollout(task, index, make_agent(agent_cls, config), config,
                                           sessions)
        with open(out_path, "a") as out:
            out.write(json.dumps(to_plain(trajectory)) + "\n")
            out.flush()
            os.fsync(out.fileno())
        on_done(trajectory)
        return trajectory

    return list(await asyncio.gather(*[one(t, i) for t in tasks for i in range(n)]))


def rollout_command(config_path: Path | None, overrides: list[str], n: int, output: Path,
                    jobs: int, run_with_progress: Callable[..., list[Trajectory]],
                    ) -> list[Trajectory]:
    """Validate everything first (one-line errors), then run with a progress display."""
    from skyrl_agent.agents.base import agent_class
    from skyrl_agent.sandboxes.base import sandbox_backend
    from skyrl_agent.tasks import resolve_tasks

    settings = load_config(config_path, overrides)
    agent_cls = agent_class(settings.agent.name)
    sandbox_backend(settings.sandbox.backend)
    tasks = resolve_tasks(settings.tasks.source, settings.tasks.include, settings.tasks.limit)
    run_dir = prepare_run_dir(output)
    (run_dir / "config.json").write_text(settings.model_dump_json(indent=2))

    async def run(on_done: Callable[[Trajectory], Any]) -> list[Trajectory]:
        if not agent_cls.needs_model:
            return await rollout_all(tasks, n, agent_cls, settings, run_dir, jobs, None, on_done)
        async with model_sessions(settings, run_dir) as sessions:
            return await rollout_all(tasks, n, agent_cls, settings, run_dir, jobs, sessions,
                                     on_done)

    return run_with_progress(run, len(tasks) * n)
