"""Trainer ranks as Ray actors, one per rank: the `Ranks` a sharded backend drives on a Ray run,
so a model's shards spread over the cluster's machines.

Rank 0 runs on the node of the actor that starts the group (the trainer actor, beside the
inference servers): it writes the servers' weights into that node's shared memory. The other
ranks go wherever the cluster has room. Ranks read the model folder and the checkpoints
themselves, so every node must see them at the same paths (a shared file system), as with any
multi-node trainer.

The ranks meet through a key-value actor, not torch's TCP store: a TCP store takes any
connection, while calls to an actor pass Ray's own authentication. Once met, gloo (CPU) talks
over the loopback when every rank is on one machine, else over the interface of the node's
address; on GPUs NCCL, one GPU per rank actor.

As with rank processes (backends/ranks.py), calls and results cross as plain pickles, and a rank
that dies (its process or its whole node) closes the group: its peers would wait for it forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pickle
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
import ray
import torch.distributed as dist
from ray.exceptions import GetTimeoutError, RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from skyrl_agent.backends.ranks import (
    RankError,
    Ranks,
    RanksLost,
    answer,
    described,
    quiet_libraries,
    results,
    start_rank,
    stop_rank,
)
from skyrl_agent.distributed.restarts import ANYWHERE_RESTARTS

log = logging.getLogger(__name__)


class Rendezvous:
    """The key-value store the ranks meet through (an async actor: a waiting `get` holds no
    thread)."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.arrivals: dict[str, asyncio.Event] = {}

    def _arrival(self, key: str) -> asyncio.Event:
        return self.arrivals.setdefault(key, asyncio.Event())

    async def set(self, key: str, value: bytes) -> None:
        self.values[key] = value
        self._arrival(key).set()

    async def get(self, key: str, timeout: float) -> bytes | None:
        """The key's value once set; None after `timeout` seconds."""
        try:
            await asyncio.wait_for(self._arrival(key).wait(), timeout)
        except TimeoutError:
            return None
        return self.values[key]

    async def add(self, key: str, amount: int) -> int:
        total = int(self.values.get(key, b"0")) + amount
        await self.set(key, str(total).encode())
        return total

    async def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        current = self.values.get(key)
        if current == expected or (current is None and not expected):
            await self.set(key, desired)
            return desired
        return expected if current is None else current

    async def check(self, keys: list[str]) -> bool:
        return all(key in self.values for key in keys)

    async def delete(self, key: str) -> bool:
        self.arrivals.pop(key, None)
        return self.values.pop(key, None) is not None

    async def count(self) -> int:
        return len(self.values)


class ActorStore(dist.Store):
    """torch.distributed's Store over the Rendezvous actor."""

    def __init__(self, rendezvous: Any, timeout: float = 600.0) -> None:
        super().__init__()
        self.rendezvous = rendezvous
        self.wait_seconds = timeout

    def set(self, key: str, value: str | bytes) -> None:
        ray.get(self.rendezvous.set.remote(key, _bytes(value)))

    def get(self, key: str) -> bytes:
        value: bytes | None = ray.get(self.rendezvous.get.remote(key, self.wait_seconds))
        if value is None:
            raise RuntimeError(f"trainer ranks: no peer set {key!r} within "
                               f"{self.wait_seconds:.0f} s")
        return value

    def add(self, key: str, amount: int) -> int:
        total: int = ray.get(self.rendezvous.add.remote(key, amount))
        return total

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        value: bytes = ray.get(self.rendezvous.compare_set.remote(
            key, _bytes(expected), _bytes(desired)))
        return value

    def wait(self, keys: list[str], timeout: Any = None) -> None:
        for key in keys:
            self.get(key)

    def check(self, keys: list[str]) -> bool:
        present: bool = ray.get(self.rendezvous.check.remote(list(keys)))
        return present

    def delete_key(self, key: str) -> bool:
        deleted: bool = ray.get(self.rendezvous.delete.remote(key))
        return deleted

    def num_keys(self) -> int:
        count: int = ray.get(self.rendezvous.count.remote())
        return count


def _bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


class RankActor:
    """One trainer rank: placed first (it reports its node), then started into the group."""

    def __init__(self) -> None:
        self.served: Any = None

    def node_address(self) -> str:
        return str(ray.util.get_node_ip_address())

    def node_id(self) -> str:
        return str(ray.get_runtime_context().get_node_id())

    def is_folder(self, path: str) -> bool:
        return Path(path).is_dir()

    def start(self, rank: int, world_size: int, rendezvous: Any, device: str, engine: str,
              settings: dict[str, Any], spans_machines: bool, threads: int) -> bytes:
        try:
            interface = _interface_of(self.node_address()) if spans_machines else "lo"
            self.served = start_rank(rank, world_size, ActorStore(rendezvous), device, engine,
                                     settings, interface, threads)
        except BaseException as error:  # noqa: BLE001 - the driver reports it
            return pickle.dumps(("error", described(error)))
        return pickle.dumps(("ok", None))

    def call(self, method: str, args: bytes) -> bytes:
        return pickle.dumps(answer(self.served, method, pickle.loads(args)),
                            protocol=pickle.HIGHEST_PROTOCOL)

    def stop(self) -> None:
        if self.served is not None:
            stop_rank(self.served)
            self.served = None


def _interface_of(address: str) -> str:
    """The network interface that carries this node's address (gloo binds to it by name)."""
    for name, entries in psutil.net_if_addrs().items():
        if any(e.family == socket.AF_INET and e.address == address for e in entries):
            return name
    raise RuntimeError(f"no network interface of this machine carries its Ray address {address}")


class RayRankGroup(Ranks):
    """`world_size` rank actors serving `engine`: RankGroup's interface on a Ray cluster. Each
    reserves `cpus` CPUs (and one GPU when `device` is cuda)."""

    def __init__(self, world_size: int, engine: str, device: str, settings: dict[str, Any],
                 cpus: float = 1.0, start_timeout: float = 600.0) -> None:
        if world_size < 1:
            raise ValueError(f"a rank group needs at least one rank, got {world_size}")
        self.world_size = world_size
        self._closed = False
        quiet_libraries()  # a Megatron rank's tensors unpickle through megatron-core's reducer
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self._rendezvous = ray.remote(Rendezvous).options(
            num_cpus=0, scheduling_strategy=here).remote()
        rank_actor: Any = ray.remote(RankActor)
        gpus = 1 if device.startswith("cuda") else 0
        self._actors = [rank_actor.options(
            num_cpus=cpus, num_gpus=gpus, scheduling_strategy=here if rank == 0 else "DEFAULT",
            max_restarts=0 if rank == 0 else ANYWHERE_RESTARTS,
        ).remote() for rank in range(world_size)]
        try:
            addresses = self._gather([a.node_address.remote() for a in self._actors],
                                     start_timeout, f"placed ({cpus:g} CPUs each)")
            log.info("trainer ranks on Ray nodes: %s",
                     ", ".join(f"rank {r} at {a}" for r, a in enumerate(addresses)))
            self._check_model_visible(settings.get("model_folder"), addresses, start_timeout)
            spans = len(set(addresses)) > 1
            started = self._gather(
                [actor.start.remote(rank, world_size, self._rendezvous, device, engine,
                                    settings, spans, max(1, int(cpus)))
                 for rank, actor in enumerate(self._actors)], start_timeout, "started")
            results({rank: pickle.loads(reply) for rank, reply in enumerate(started)},
                     world_size)
        except BaseException:
            self.close()
            raise

    def _check_model_visible(self, folder: str | None, addresses: list[str],
                             timeout: float) -> None:
        """Ranks load the model themselves: one on a node without it is refused in one line."""
        if folder is None:
            return
        sees = self._gather([actor.is_folder.remote(folder) for actor in self._actors],
                            timeout, "asked for the model folder")
        for rank, seen in enumerate(sees):
            if not seen:
                raise ValueError(
                    f"trainer rank {rank} (node {addresses[rank]}) cannot read the model folder "
                    f"{folder}: every node needs the model and the run dir at the same paths "
                    f"(a shared file system)")

    def call_each(self, method: str, args: Sequence[tuple[Any, ...]]) -> list[Any]:
        if self._closed:
            raise RankError("the trainer ranks were closed")
        refs = [actor.call.remote(method, pickle.dumps(tuple(rank_args)))
                for actor, rank_args in zip(self._actors, args, strict=True)]
        replies = self._gather(refs, None, "answered")
        return results({rank: pickle.loads(reply) for rank, reply in enumerate(replies)},
                       self.world_size)

    def _gather(self, refs: list[Any], timeout: float | None, doing: str) -> list[Any]:
        """Every ref's value; the first rank that dies closes the group at once (its peers may
        be waiting for it inside a collective)."""
        values: dict[int, Any] = {}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=timeout)
            if not ready:
                self.close()
                raise RankError(f"the trainer ranks were not {doing} within {timeout:.0f} s")
            rank = refs.index(ready[0])
            try:
                values[rank] = ray.get(ready[0])
            except RayActorError as error:
                self.close(timeout=0.0)
                raise RanksLost(f"trainer rank {rank} was lost ({type(error).__name__}: its "
                                f"process or its node died); checkpoints and stored samples "
                                f"are kept for --resume") from None
        return [values[rank] for rank in range(len(refs))]

    def close(self, timeout: float = 30.0) -> None:
        """Stop every rank (asked first, then killed) and the rendezvous."""
        if self._closed:
            return
        self._closed = True
        stopping = [actor.stop.remote() for actor in self._actors]
        with contextlib.suppress(GetTimeoutError, RayActorError):
            ray.wait(stopping, num_returns=len(stopping), timeout=timeout)
        for actor in [*self._actors, self._rendezvous]:
            with contextlib.suppress(Exception):
                ray.kill(actor)
