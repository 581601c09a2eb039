"""Trainer ranks as child processes, driven in lock-step by the process that owns the backend.

A sharded backend starts one process per rank. Each builds its engine (`engine` names a class
or function as `module:name`, called with the rank, the world size and the given keywords)
inside a torch process group, then serves calls: the driver sends every rank a call, each runs
it (collectives inside), and the driver waits for every reply. An error in one rank is raised
in the driver; a rank that dies ends the whole group, since its peers would wait for it forever.

Calls and results travel as plain pickles: multiprocessing's own pickler would hand tensors over
as shared memory, so a result would keep changing with the rank's live tensors (a gradient the
driver read, scaled in place by the next clip).

The group meets through a file store in a private folder, not a TCP store: nobody else on the
machine can join it. On CPU the ranks talk over gloo on the loopback interface, on GPUs over
NCCL, one GPU per rank.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import pickle
import shutil
import signal
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from multiprocessing import get_context
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Protocol

from skyrl_agent.errors import RunStopped

log = logging.getLogger(__name__)

STOP = "__stop__"
"""The call that ends a rank's loop."""


class RankError(RuntimeError):
    """A rank failed or died; the group is closed."""


class RanksLost(RankError, RunStopped):
    """A rank's process (or its machine) died: the run stops in one line, its checkpoints and
    stored samples kept for --resume."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        RunStopped.__init__(self, message, exit_code)


class Ranks(Protocol):
    """What a sharded backend's driver needs of its ranks, wherever they run."""

    world_size: int

    def call(self, method: str, *args: Any) -> list[Any]:
        """Every rank runs `method(*args)`; their results in rank order."""
        return self.call_each(method, [args] * self.world_size)

    def call_each(self, method: str, args: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Rank r runs `method(*args[r])`; their results in rank order."""
        ...

    def close(self) -> None: ...


StartRanks = Callable[[int, str, str, dict[str, Any]], Ranks]
"""Starts `world_size` ranks serving `engine` on `device` with `settings` (RankGroup itself, or
one actor per rank on Ray: distributed/ranks.py)."""


class RankGroup(Ranks):
    """`world_size` rank processes serving `engine`'s methods."""

    def __init__(self, world_size: int, engine: str, device: str,
                 settings: dict[str, Any], start_timeout: float = 600.0) -> None:
        if world_size < 1:
            raise ValueError(f"a rank group needs at least one rank, got {world_size}")
        self.world_size = world_size
        quiet_libraries()  # a Megatron rank's tensors unpickle through megatron-core's reducer
        self._folder = Path(tempfile.mkdtemp(prefix="skyrl-agent-ranks-"))
        self._closed = False
        context = get_context("spawn")  # a fork of a threaded process may hold a lock forever
        self._connections: list[Connection] = []
        self._processes = []
        try:
            for rank in range(world_size):
                ours, theirs = context.Pipe()
                process = context.Process(
                    target=_serve, name=f"skyrl-agent-rank-{rank}", daemon=True,
                    args=(rank, world_size, str(self._folder / "store"), device, engine,
                          settings, theirs, os.getpid()))
                process.start()
                theirs.close()
                self._connections.append(ours)
                self._processes.append(process)
            self._collect(timeout=start_timeout)  # each rank answers once its engine is built
        except BaseException:
            self.close()
            raise

    def call_each(self, method: str, args: Sequence[tuple[Any, ...]]) -> list[Any]:
        if self._closed:
            raise RankError("the trainer ranks were closed")
        for connection, rank_args in zip(self._connections, args, strict=True):
            try:
                _send(connection, (method, rank_args))
            except (BrokenPipeError, ConnectionResetError):
                self._lost()
        return self._collect()

    def _collect(self, timeout: float | None = None) -> list[Any]:
        replies: dict[int, tuple[str, Any]] = {}
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(replies) < self.world_size:
            waiting = {self._connections[r]: r for r in range(self.world_size) if r not in replies}
            sentinels = {self._processes[r].sentinel: r for r in waiting.values()}
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = wait([*waiting, *sentinels], timeout=left)
            if not ready:
                self.close()
                raise RankError(f"the trainer ranks did not answer within {timeout:.0f} s")
            for item in ready:
                if item in waiting:
                    rank = waiting[item]
                    try:
                        replies[rank] = _receive(self._connections[rank])
                    except (EOFError, ConnectionResetError):
                        self._lost()
            if not any(item in waiting for item in ready):
                self._lost()
        return results(replies, self.world_size)

    def _lost(self) -> None:
        codes = {rank: p.exitcode for rank, p in enumerate(self._processes)
                 if p.exitcode is not None}
        self.close()
        died = ", ".join(f"rank {rank} (exit code {code})" for rank, code in codes.items())
        raise RanksLost(f"trainer ranks lost: {died or 'a pipe broke'}; the backend is closed")

    def close(self, timeout: float = 30.0) -> None:
        """Stop every rank (asked first, then killed) and remove the group's folder."""
        if self._closed:
            return
        self._closed = True
        for connection in self._connections:
            with contextlib.suppress(OSError):
                _send(connection, (STOP, ()))
        deadline = time.monotonic() + timeout
        for process in self._processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()
        for connection in self._connections:
            connection.close()
        shutil.rmtree(self._folder, ignore_errors=True)


def _serve(rank: int, world_size: int, store: str, device: str, engine: str,
           settings: dict[str, Any], connection: Connection, parent: int) -> None:
    """A rank's whole life: join the group, build the engine, answer calls until told to stop."""
    # Ctrl-C reaches the whole process group: the driver decides what happens to its ranks
    # (it stops them, or they end with it), so a rank neither dies mid-collective nor prints a
    # traceback of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_with(parent)
    import torch.distributed as dist

    try:
        served = start_rank(rank, world_size, dist.FileStore(store, world_size), device,
                            engine, settings)
    except BaseException as error:  # noqa: BLE001 - the driver reports it
        _send(connection, ("error", described(error)))
        return
    _send(connection, ("ok", None))
    try:
        while True:
            try:
                method, args = _receive(connection)
            except (EOFError, OSError):
                break  # the driver is gone
            if method == STOP:
                break
            _send(connection, answer(served, method, args))
    finally:
        stop_rank(served)


def start_rank(rank: int, world_size: int, store: Any, device: str, engine: str,
               settings: dict[str, Any], interface: str = "lo", threads: int | None = None,
               ) -> Any:
    """Join the process group through `store` and build the rank's engine. Gloo (CPU) talks
    over `interface`: the loopback unless the group spans machines. `threads`: torch's CPU
    threads (default: this machine's cores shared by the ranks)."""
    quiet_libraries()
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads or max(1, (os.cpu_count() or 1) // world_size))
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if backend == "gloo":
        os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
    else:
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size)
    module, name = engine.split(":")
    return getattr(importlib.import_module(module), name)(
        rank=rank, world_size=world_size, device=device, **settings)


def answer(served: Any, method: str, args: tuple[Any, ...]) -> tuple[str, Any]:
    """The rank's reply to one call: ("ok", result) or ("error", what went wrong)."""
    try:
        return "ok", getattr(served, method)(*args)
    except Exception as error:  # noqa: BLE001 - the driver reports it
        return "error", described(error)


def stop_rank(served: Any) -> None:
    """Release what the engine holds outside the process (shared memory), leave the group."""
    import torch.distributed as dist

    closing = getattr(served, "close", None)
    if closing is not None:
        closing()
    dist.destroy_process_group()


def results(replies: dict[int, tuple[str, Any]], world_size: int) -> list[Any]:
    """Every rank's result in rank order, or the first failure raised: a ValueError (bad
    input) as itself, like the one-process backend, anything else as a RankError."""
    failures = [(rank, reply[1]) for rank, reply in sorted(replies.items())
                if reply[0] == "error"]
    if failures:
        rank, (kind, message, trace) = failures[0]
        log.debug("trainer rank %d failed:\n%s", rank, trace)
        if kind == "ValueError":
            raise ValueError(message)
        raise RankError(f"trainer rank {rank} failed: {kind}: {message}")
    return [replies[rank][1] for rank in range(world_size)]


def quiet_libraries() -> None:
    """Ranks share the terminal with the run's own progress display: known, harmless notices
    (megatron-core's optional kernels and its GPTModel deprecation, torch's CUDA probe on a
    machine without CUDA) stay out of it. Errors still come through."""
    warnings.filterwarnings("ignore", module=r"megatron\.")
    for name in ("megatron", "torch.utils.cpp_extension"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _send(connection: Connection, message: Any) -> None:
    connection.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def _receive(connection: Connection) -> Any:
    return pickle.loads(connection.recv_bytes())


def described(error: BaseException) -> tuple[str, str, str]:
    return type(error).__name__, str(error), traceback.format_exc()


def _exit_with(parent: int) -> None:
    """End this rank when the driver's process ends, even mid-collective (where a rank would
    otherwise wait for its peers until the process group's timeout)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
