"""Model access for agents: LLM sessions over the configured endpoint or over embedded servers
started (and stopped) here, and the supervision that stops a run when a server it needs dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skyrl_agent.agents.base import Agent
from skyrl_agent.collector.one_sample import SessionFactory
from skyrl_agent.config import InferenceConfig, RunConfig
from skyrl_agent.data.run_dir import RunDir
from skyrl_agent.errors import RunStopped
from skyrl_agent.inference.auth import endpoint_key, save_server_keys
from skyrl_agent.inference.client import InferenceClient
from skyrl_agent.inference.process import ServerProcess
from skyrl_agent.llm.session import LLMSession, SessionConfig
from skyrl_agent.model.vision import ImageInputs

log = logging.getLogger(__name__)
SERVER_POLL_S = 0.25
"""How often a supervised server is checked: its death stops the run within this."""


@dataclass
class ModelAccess:
    """What agents reach the model through: a session factory, the client under it (for
    pause / update_weights / resume), and the server started for them (None when the endpoint
    runs elsewhere)."""

    sessions: SessionFactory
    client: InferenceClient
    servers: list[ServerProcess]
    """The embedded servers started here (none when the endpoint runs elsewhere)."""


def session_config(config: RunConfig, served_max_len: int | None) -> SessionConfig:
    """Per-session budgets from the run config, the context clamped to what the servers serve."""
    budget, inference = config.agent, config.inference
    settings = SessionConfig(
        max_context_tokens=budget.max_context_tokens, max_tokens=inference.max_tokens,
        temperature=inference.temperature, top_p=inference.top_p,
        summarize_at=budget.summarize_at, max_summaries=budget.max_summaries,
        context_management=budget.context_management,
        max_sampled_tokens=budget.max_sampled_tokens)
    if budget.summary_prompt:
        settings = dataclasses.replace(settings, summary_prompt=budget.summary_prompt)
    if served_max_len and served_max_len < settings.max_context_tokens:
        settings = dataclasses.replace(settings, max_context_tokens=served_max_len)
    return settings


def session_factory(client: Any, tokenizer: Any, settings: SessionConfig,
                    images: ImageInputs | None = None) -> SessionFactory:
    """LLM sessions over `client` (an InferenceClient, or anything with its complete and
    end_session calls); `images` for a vision model."""
    def factory(agent: Agent, session_id: str) -> LLMSession:
        return LLMSession(client, tokenizer, settings, tools=agent.tools_for(images is not None),
                          session_id=session_id, images=images)
    return factory


def model_servers(config: RunConfig, run_dir: Path) -> list[ServerProcess]:
    """inference.num_servers servers of inference.engine, not started yet."""
    count = config.inference.num_servers
    return [model_server(config.inference, RunDir(run_dir).server_log_of(i, count),
                         config.trainer.lora_rank, config.trainer.routing_replay)
            for i in range(count)]


def model_server(inference: InferenceConfig, log_path: Path,
                 lora_rank: int = 0, routed_experts: bool = False) -> ServerProcess:
    """One server of inference.engine for inference.model, not started yet (what both
    placements start: this process's subprocess, or a Ray server actor's); `lora_rank`: the
    trainer's adapters, which a vLLM server then takes as they are; `routed_experts`: routing
    replay, which a vLLM server must be started for (the embedded one answers per request)."""
    if inference.engine == "vllm":
        from skyrl_agent.inference.vllm.launch import VLLMOptions, vllm_server
        from skyrl_agent.model.names import resolve_model

        options = VLLMOptions(model=str(resolve_model(inference.model)),
                              served_model_name=inference.model, dtype=inference.dtype,
                              kv_cache_mb=inference.kv_cache_mb, lora_rank=lora_rank,
                              routed_experts=routed_experts)
        return vllm_server(options, log_path=log_path)
    from skyrl_agent.inference.process import embedded_server

    return embedded_server(inference.model, dtype=inference.dtype,
                           kv_cache_mb=inference.kv_cache_mb, log_path=log_path)


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

    from skyrl_agent.model.names import resolve_model

    folder = resolve_model(config.inference.model)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    images = ImageInputs.for_model(folder)
    servers: list[ServerProcess] = []
    try:
        if config.inference.endpoint:
            urls, keys = [config.inference.endpoint], [endpoint_key()]
        else:
            servers = model_servers(config, run_dir)
            log.info("starting %d %s model server(s) (%s)", len(servers),
                     config.inference.engine, config.inference.model)
            urls = await asyncio.to_thread(start_all, servers)
            keys = [server.api_key for server in servers]
            save_server_keys(run_dir, urls, keys)
            log.info("model server(s) ready at %s", ", ".join(urls))
        async with InferenceClient(urls, api_keys=keys,
                                   routed_experts=config.trainer.routing_replay) as client:
            settings = session_config(config, await client.max_model_len())
            yield ModelAccess(session_factory(client, tokenizer, settings, images), client,
                              servers)
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
