"""The actors of a Ray run: plain classes, made remote by workers.py with their placement.

Each wraps the one-process part it stands for, so the behaviour is the same code; only the calls
cross processes. Arguments and results travel by Ray's serialization (frozen dataclasses). Only
the trainer's process imports torch (the others would pay its memory for nothing).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from skyrl_agent.agents.base import Agent
from skyrl_agent.collector.collector import Collector, TrajectorySink
from skyrl_agent.collector.model_access import model_server, session_factory
from skyrl_agent.config import InferenceConfig, RunConfig
from skyrl_agent.data.store import TrajectoryStore
from skyrl_agent.distributed.proxy import Remote, Served, ServedAsync
from skyrl_agent.inference.client import CompletionClient, InferenceClient
from skyrl_agent.inference.process import ServerProcess
from skyrl_agent.llm.session import SessionConfig
from skyrl_agent.model.vision import ImageInputs
from skyrl_agent.rl.workers import ServerControl
from skyrl_agent.tasks.spec import TaskSpec
from skyrl_agent.types import TrajectoryGroup

if TYPE_CHECKING:  # only the trainer actor's process needs torch
    pass


class ServerActor:
    """One model server of inference.engine, a subprocess of this actor (it dies with the
    actor). Placed on the driver's node, with the router: a vLLM server's Unix socket is
    reachable on its own machine only."""

    def __init__(self, inference: InferenceConfig, log_path: Path, lora_rank: int = 0,
                 routed_experts: bool = False) -> None:
        self.server: ServerProcess = model_server(inference, log_path, lora_rank, routed_experts)

    def start(self) -> str:
        return self.server.start()

    def api_key(self) -> str | None:
        """The key of the server's control routes (only the run's own actors ask)."""
        return self.server.api_key

    def status(self) -> tuple[bool, int | None, str]:
        """(running, exit status, log path)."""
        return self.server.running, self.server.returncode, str(self.server.log_path)

    def stop(self) -> None:
        self.server.stop()


class RouterActor(ServedAsync):
    """The run's one InferenceClient: every collector's sessions go through it, so a session
    sticks to one server and new sessions go to the least busy, whichever actor asks. Serves
    the trainer's ServerControl and the sessions' CompletionClient (distributed/proxy.py)."""

    def __init__(self, urls: Sequence[str], keys: Sequence[str | None] | None = None,
                 routed_experts: bool = False) -> None:
        self.client = InferenceClient(urls, api_keys=keys, routed_experts=routed_experts)
        self.serve(self.client, ServerControl, CompletionClient)

    async def max_model_len(self) -> int | None:
        return await self.client.max_model_len()

    async def sessions_by_server(self) -> dict[str, int]:
        """Live sessions per server URL (what routing balances)."""
        return {s.url: len(s.sessions) for s in self.client.servers}

    async def close(self) -> None:
        await self.client.close()


class StoreActor(Served):
    """The single writer of the run's TrajectoryStore; serves what a Collector needs of it
    (TrajectorySink)."""

    def __init__(self, run_dir: Path) -> None:
        self.store = TrajectoryStore(run_dir, writable=True)
        self.serve(self.store, TrajectorySink)

    def close(self) -> None:
        self.store.close()


class StoreClient(Remote):
    """TrajectorySink over the StoreActor. The Collector calls it in threads: a concurrent
    future's result() blocks only the calling thread (ray.get would warn that it blocks the
    actor's event loop)."""

    def __init__(self, actor: Any, run_dir: Path) -> None:
        super().__init__(actor, TrajectorySink, lambda ref: ref.future().result())
        self.run_dir = run_dir


class RouterClient(Remote):
    """An LLMSession's CompletionClient over the RouterActor (its calls are awaited)."""

    def __init__(self, actor: Any) -> None:
        super().__init__(actor, CompletionClient, lambda ref: ref)


class CollectorActor:
    """A Collector whose store and model calls go to the run's StoreActor and RouterActor."""

    def __init__(self, config: RunConfig, agent_cls: type[Agent], store: Any, router: Any,
                 run_dir: Path, settings: SessionConfig) -> None:
        from transformers import AutoTokenizer

        from skyrl_agent.model.names import resolve_model

        folder = resolve_model(config.inference.model)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        self.collector = Collector(
            config, agent_cls, cast(TrajectorySink, StoreClient(store, run_dir)),
            session_factory(RouterClient(router), tokenizer, settings,
                            ImageInputs.for_model(folder)))

    async def run_group(self, task: TaskSpec, indices: list[int]) -> TrajectoryGroup:
        return await self.collector.run_group(task, indices)

    async def close(self) -> None:
        await self.collector.close()

    async def ping(self) -> None:
        """Answers once the actor is constructed (its tokenizer loaded)."""
        await asyncio.sleep(0)


class TrainerActor(Served):
    """The trainer backend, in its own process; a sharded backend's ranks are actors of their
    own (distributed/ranks.py). Serves the TrainerBackend protocol (distributed/proxy.py)."""

    def __init__(self, config: RunConfig) -> None:
        from skyrl_agent.backends.backend import TrainerBackend
        from skyrl_agent.backends.build import make_backend
        from skyrl_agent.distributed.ranks import RayRankGroup

        self.backend = make_backend(config, ranks=partial(RayRankGroup,
                                                          cpus=config.ray.rank_cpus))
        self.serve(self.backend, TrainerBackend)

    def step(self) -> int:
        return self.backend.step
