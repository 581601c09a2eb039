"""The Ray placement: a training run's parts started as actors, behind the one-process protocols.

The driver (the `train` process) keeps the loop; every call it makes crosses to an actor. A dead
actor or server stops the run with one line, like a dead server in one process; the store, the
checkpoints and --resume work the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import ray
from ray.exceptions import ActorUnschedulableError, RayActorError, RayError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from skyrl_agent.agents.base import Agent
from skyrl_agent.backends.backend import OptimStepOutput, TrainerBackend, TrainingState
from skyrl_agent.collector.model_access import session_config, watched
from skyrl_agent.config import RunConfig
from skyrl_agent.data.run_dir import RunDir
from skyrl_agent.distributed.actors import (
    CollectorActor,
    RouterActor,
    ServerActor,
    StoreActor,
    TrainerActor,
)
from skyrl_agent.distributed.proxy import Remote
from skyrl_agent.distributed.restarts import ANYWHERE_RESTARTS
from skyrl_agent.errors import RunStopped, UserError
from skyrl_agent.inference.auth import endpoint_key, save_server_keys
from skyrl_agent.rl.workers import ServerControl, Workers
from skyrl_agent.tasks.spec import TaskSpec
from skyrl_agent.types import TrajectoryGroup

log = logging.getLogger(__name__)


def connect(config: RunConfig) -> bool:
    """Join or start the cluster ray.address names; True when this call started it. Called
    off the main thread, so Ray leaves the run's own SIGTERM handling in place."""
    address = config.ray.address
    if ray.is_initialized():
        return False
    if address == "auto":
        try:
            ray.init(address="auto", logging_level=logging.ERROR)
            log.info("joined the running Ray cluster")
            return False
        except ConnectionError:
            log.info("no Ray cluster is running: starting a local instance")
    if address in ("auto", "local"):
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False,
                 logging_level=logging.ERROR)
        return True
    try:
        ray.init(address=address, logging_level=logging.ERROR)
    except (ConnectionError, ValueError) as exc:
        raise UserError(f"cannot reach the Ray cluster at {address}: {exc}") from None
    return False


def _check_room(config: RunConfig) -> None:
    """Actors that can never be placed would wait forever: refuse them with one line."""
    placed = config.ray
    needed = (placed.trainer_cpus + config.inference.num_servers * placed.server_cpus
              + config.trainer.rank_count * placed.rank_cpus)
    here = ray.available_resources().get("CPU", 0.0)
    if here < needed:
        raise UserError(f"the Ray cluster has {here:g} free CPUs; this run reserves {needed:g} "
                        "(ray.trainer_cpus + inference.num_servers x ray.server_cpus + trainer "
                        "ranks x ray.rank_cpus)")


class RemoteBackend(Remote):
    """The TrainerBackend protocol over the TrainerActor (calls block: loops run them in
    threads); `step` follows what the optimizer and a loaded state say."""

    def __init__(self, actor: Any) -> None:
        super().__init__(actor, TrainerBackend, _trained)
        self.step: int = ray.get(actor.step.remote())  # a failed start: ray_workers says why

    def _delivered(self, result: Any) -> Any:
        if isinstance(result, (OptimStepOutput, TrainingState)):
            self.step = result.step
        return result


def _last_line(error: Exception) -> str:
    """What a Ray error's own traceback ends with (the error the actor raised)."""
    lines = [line.strip() for line in re.sub(r"\x1b\[[0-9;]*m", "", str(error)).splitlines()]
    return next((line for line in reversed(lines) if line), type(error).__name__)


def _trained(ref: Any) -> Any:
    """The trainer actor's result; a run-stopping error inside it (its ranks lost) or its own
    death stops the run in one line."""
    try:
        return ray.get(ref)
    except RayTaskError as exc:
        if isinstance(exc.cause, RunStopped):
            raise exc.cause from None
        raise
    except RayActorError as exc:
        raise RunStopped(f"the trainer's Ray actor died ({exc.__class__.__name__}); "
                         "checkpoints and stored samples are kept for --resume") from exc


class RemoteCollectors:
    """Groups go to the collector actor with the fewest groups running."""

    def __init__(self, actors: list[Any]) -> None:
        self.actors = actors
        self.running = [0] * len(actors)
        self.groups_run = [0] * len(actors)
        """Groups each actor was given (how the fan-out spread)."""

    async def run_group(self, task: TaskSpec, indices: Sequence[int]) -> TrajectoryGroup:
        chosen = min(range(len(self.actors)), key=lambda i: (self.running[i], self.groups_run[i]))
        self.running[chosen] += 1
        self.groups_run[chosen] += 1
        ref = self.actors[chosen].run_group.remote(task, list(indices))
        try:
            group: TrajectoryGroup = await ref
            return group
        except asyncio.CancelledError:
            ray.cancel(ref)  # the actor cancels the group: its sandboxes stop
            with contextlib.suppress(RayError):
                await ref
            raise
        except RayActorError as exc:
            raise RunStopped(f"a collector actor died ({exc.__class__.__name__}: its process or "
                             f"its node died); checkpoints and stored samples are kept for "
                             f"--resume") from exc
        finally:
            self.running[chosen] -= 1

    async def close(self) -> None:
        await asyncio.gather(*[a.close.remote() for a in self.actors], return_exceptions=True)


def _here() -> NodeAffinitySchedulingStrategy:
    """On the driver's node: shared-memory weights and 127.0.0.1 servers do not leave it."""
    return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)


def collector_nodes(count: int, here: str, alive: Sequence[str]) -> list[str]:
    """The node for each of `count` collectors: round-robin over the alive nodes, the driver's
    node (`here`: trainer, servers, rank 0) last, so sandboxes go to the other machines first.
    Ray's own SPREAD is best effort and may put every zero-CPU actor on one node."""
    order = [*sorted(node for node in set(alive) if node != here), here]
    return [order[i % len(order)] for i in range(count)]


def _collector_placement(index: int, count: int) -> NodeAffinitySchedulingStrategy:
    """Collector `index`'s node, held to it: Ray's soft affinity was seen to place a zero-CPU
    actor on another node than asked even with the asked one idle. A node that died since the
    lookup fails the actor, and `start` places it once more on a fresh view."""
    alive = [node["NodeID"] for node in ray.nodes() if node["Alive"]]
    here = ray.get_runtime_context().get_node_id()
    node = collector_nodes(count, here, alive)[index]
    return NodeAffinitySchedulingStrategy(node, soft=False)


@dataclass
class _Actors:
    """The run's actors, in the order they start; `spawn` records each for the final kill."""

    every: list[Any] = field(default_factory=list)
    store: Any = None
    trainer: Any = None
    servers: list[Any] = field(default_factory=list)
    router: Any = None
    collectors: list[Any] = field(default_factory=list)

    def spawn(self, cls: type, cpus: float, strategy: Any, *args: Any) -> Any:
        remote: Any = ray.remote(cls)
        actor = remote.options(num_cpus=cpus, scheduling_strategy=strategy).remote(*args)
        self.every.append(actor)
        return actor

    async def start(self, config: RunConfig, run_dir: Path, agent_cls: type[Agent]) -> None:
        here, placed = _here(), config.ray
        self.store = self.spawn(StoreActor, 0, here, run_dir)
        self.trainer = self.spawn(TrainerActor, placed.trainer_cpus, here, config)
        urls = [config.inference.endpoint] if config.inference.endpoint else []
        keys = [endpoint_key()] if urls else []
        if not urls:
            count = config.inference.num_servers
            self.servers = [self.spawn(ServerActor, placed.server_cpus, here, config.inference,
                                       RunDir(run_dir).server_log_of(i, count),
                                       config.trainer.lora_rank, config.trainer.routing_replay)
                            for i in range(count)]
            try:
                urls = list(await asyncio.gather(*[s.start.remote() for s in self.servers]))
            except RayTaskError as exc:  # e.g. the server would not start: its own error
                raise exc.cause from None
            keys = list(await asyncio.gather(*[s.api_key.remote() for s in self.servers]))
            save_server_keys(run_dir, urls, keys)
        self.router = self.spawn(RouterActor, 0, here, urls, keys,
                                 config.trainer.routing_replay)
        settings = session_config(config, await self.router.max_model_len.remote())

        def collector(index: int) -> Any:
            return self.spawn(CollectorActor, 0, _collector_placement(index, placed.collectors),
                              config, agent_cls, self.store, self.router, run_dir, settings)

        self.collectors = [collector(i) for i in range(placed.collectors)]
        for attempt in range(1 + ANYWHERE_RESTARTS):
            pings = await asyncio.gather(*[c.ping.remote() for c in self.collectors],
                                         return_exceptions=True)
            lost = [i for i, ping in enumerate(pings)
                    if isinstance(ping, RayActorError | ActorUnschedulableError)]
            if lost and attempt == ANYWHERE_RESTARTS:
                raise pings[lost[0]]
            for i in lost:  # placed on a node that had just died: once more, elsewhere
                self.collectors[i] = collector(i)

    async def stop(self) -> None:
        """Stop what holds resources outside Ray (sandboxes, shared memory, server processes,
        the store's lock), then end every actor."""
        steps = [*[c.close.remote() for c in self.collectors],
                 *([self.trainer.call.remote("close")] if self.trainer else [])]
        await asyncio.gather(*steps, return_exceptions=True)  # a dead actor has nothing left
        steps = [*[s.stop.remote() for s in self.servers],
                 *([self.store.close.remote()] if self.store else [])]
        await asyncio.gather(*steps, return_exceptions=True)
        for actor in self.every:
            ray.kill(actor)


async def _stopped(servers: list[Any]) -> str | None:
    try:
        statuses = await asyncio.gather(*[s.status.remote() for s in servers])
    except RayActorError:
        return "a model server's Ray actor died"
    for running, status, log_path in statuses:
        if not running:
            return f"the model server exited (status {status}; its log: {log_path})"
    return None


@contextlib.asynccontextmanager
async def ray_workers(config: RunConfig, run_dir: Path, agent_cls: type[Agent],
                      ) -> AsyncIterator[Workers]:
    """Every part of the run as a Ray actor; all stopped (and a cluster started here shut
    down) on exit."""
    started = await asyncio.to_thread(connect, config)
    actors = _Actors()
    try:
        _check_room(config)
        try:
            await actors.start(config, run_dir, agent_cls)
            backend = await asyncio.to_thread(RemoteBackend, actors.trainer)
        except RayActorError as exc:
            raise RunStopped(f"a Ray actor died while starting: {_last_line(exc)}") from exc
        log.info("on Ray: %d collector actors, %d server actors, a trainer and a store writer",
                 len(actors.collectors), len(actors.servers))

        async def supervise(work: Coroutine[Any, Any, Any]) -> Any:
            return await watched(work, lambda: _stopped(actors.servers))

        collectors = RemoteCollectors(actors.collectors)
        servers = cast(ServerControl, Remote(actors.router, ServerControl, lambda ref: ref))
        yield Workers(cast(TrainerBackend, backend), collectors, servers, supervise)
        log.info("groups per collector actor: %s", collectors.groups_run)
    finally:
        await actors.stop()
        if started:
            ray.shutdown()
