"""Stopping a run on SIGTERM the way Ctrl-C stops it: the work is cancelled, the clean-ups it
started (a sandbox's shielded stop) run to their end, and `RunStopped` says so in one line.
The same holds across a stage run in a child process: a stopped parent stops its child, and
waits for the child's clean-ups before it returns."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import pickle
import signal
from collections.abc import Callable, Coroutine
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from skyrl_agent.errors import RunStopped

logger = logging.getLogger(__name__)

CHILD_STOP_GRACE_S = 120.0
"""How long a stopped child may take over its clean-ups before it is killed."""


def stop_on_sigterm() -> None:
    """Make SIGTERM raise RunStopped (exit code 143) in the main thread, as Ctrl-C raises
    KeyboardInterrupt: the clean-ups on the way out run (a stage's child is stopped and waited
    for) instead of the process vanishing with its children left running."""
    signal.signal(signal.SIGTERM, _raise_stopped)


def _raise_stopped(signum: int, frame: object) -> None:
    raise _stopped_by_sigterm()


def _stopped_by_sigterm() -> RunStopped:
    return RunStopped("terminated by SIGTERM; work already stored is kept", exit_code=143)


def run_until_stopped[T](make_coro: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """`asyncio.run(make_coro())`, where SIGTERM cancels the work like Ctrl-C does and raises
    RunStopped (exit code 143) once every clean-up has finished. Main thread only."""
    async def runner() -> T:
        main = asyncio.current_task()
        assert main is not None
        terminated = False

        def on_sigterm() -> None:
            nonlocal terminated
            terminated = True
            if not main.cancelling():  # a second cancel would cut the clean-ups short
                main.cancel()

        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, on_sigterm)
        try:
            return await make_coro()
        except BaseException as error:  # e.g. RunStopped after a dead server cancelled the work
            await _drain(main)
            if terminated and isinstance(error, asyncio.CancelledError):
                raise _stopped_by_sigterm() from None
            raise

    previous = signal.getsignal(signal.SIGTERM)
    try:
        return asyncio.run(runner())
    finally:
        signal.signal(signal.SIGTERM, previous)  # a closed loop leaves SIG_DFL behind


async def _drain(main: asyncio.Task[Any]) -> None:
    """Let clean-ups still running elsewhere finish (e.g. a sandbox's shielded stop(), left
    running on its own when its episode was cancelled during it): asyncio.run would cancel them
    halfway once the main task ends, whether by a cancel or by an error such as RunStopped."""
    # Until none is left: a clean-up may start another (a sandbox released in the background).
    while others := [task for task in asyncio.all_tasks() if task is not main]:
        await asyncio.gather(*others, return_exceptions=True)


def in_child[T](function: Callable[..., T], *args: Any, log_file: Path | None = None) -> T:
    """`function(*args)` in a fresh process, its result returned and its exception raised.
    A torch trainer's allocator keeps gigabytes after the work is done (glibc arenas per
    thread), so a training stage run in the caller's process would stay in its memory for
    every later stage; a child's memory goes back to the system when it ends. When the caller
    is interrupted while it waits (SIGTERM raised as an exception, Ctrl-C), the child gets
    SIGTERM and is waited for, so that it stops its own sandboxes and servers."""
    context = multiprocessing.get_context("spawn")
    receiving, sending = context.Pipe(duplex=False)
    child = context.Process(target=_child_main, args=(sending, function, args, log_file),
                            name=f"skyrl-agent {function.__name__}")
    child.start()
    sending.close()
    outcome: tuple[bool, Any] | None = None
    try:
        outcome = receiving.recv()
    except EOFError:
        pass  # the child died without a word: said below, with its exit code
    finally:
        receiving.close()
        _end(child, finished=outcome is not None)
    if outcome is None:
        raise RunStopped(f"the {function.__name__} stage's process ended with exit code "
                         f"{child.exitcode} before it finished")
    succeeded, value = outcome
    if not succeeded:
        raise value
    return value


def _end(child: multiprocessing.process.BaseProcess, finished: bool) -> None:
    if finished:
        child.join(timeout=30.0)  # it has sent its result and is exiting
    if child.is_alive():
        child.terminate()
        child.join(timeout=CHILD_STOP_GRACE_S)
    if child.is_alive():
        logger.warning("%s did not stop within %.0f s of SIGTERM; killed", child.name,
                       CHILD_STOP_GRACE_S)
        child.kill()
        child.join()


def _child_main(sending: Connection, function: Callable[..., Any], args: tuple[Any, ...],
                log_file: Path | None) -> None:
    _child_logging(log_file)
    stop_on_sigterm()  # the parent's SIGTERM ends the work through its clean-ups, not midway
    try:
        outcome: tuple[bool, Any] = (True, function(*args))
    except RunStopped as stopped:
        outcome = (False, stopped)
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group
        outcome = (False, RunStopped("interrupted; work already stored is kept", exit_code=130))
    except Exception as error:
        logger.exception("%s failed", function.__name__)
        outcome = (False, error)
    with contextlib.suppress(OSError):  # a parent that stopped waiting has closed its end
        try:
            sending.send(outcome)
        except (pickle.PicklingError, TypeError, AttributeError):  # the error as text, then
            sending.send((False, RuntimeError(repr(outcome[1]))))
    sending.close()


def _child_logging(log_file: Path | None) -> None:
    logging.getLogger("skyrl_agent").setLevel(logging.INFO)
    if log_file is not None:
        handler = logging.FileHandler(log_file, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger().addHandler(handler)
