"""`harbor serve` (Harbor's job server, with its inference relay) on 127.0.0.1 for a run of ours
or a test: a key of its own (its REST, its relay and the connector's WebSocket all ask for it),
its data under the given folder, stopped at the end."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

HARBOR = Path(sys.executable).parent / "harbor"
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class HarborServer:
    """A running `harbor serve`."""

    url: str
    """Its base URL on 127.0.0.1 (also its relay URL)."""
    api_key: str
    """HARBOR_API_KEY: its REST, relay and connector ask for it."""
    log: Path
    """Its output."""


class HarborServeFailed(RuntimeError):
    """`harbor serve` exited or did not answer in time."""


def _dies_with_parent() -> None:
    """In the child before exec: SIGTERM when the process that started it dies, so a killed
    run leaves no job server running its jobs on."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _spawn(folder: Path) -> tuple[HarborServer, subprocess.Popen[bytes]]:
    """Start it (call from a thread that outlives it: its death signal follows that thread)."""
    port, key = free_port(), secrets.token_hex(16)
    url = f"http://127.0.0.1:{port}"
    log = folder / "harbor-serve.log"
    env = {**os.environ, "HARBOR_API_KEY": key, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(HARBOR), "serve", "--host", "127.0.0.1", "--port", str(port),
             "--data-dir", str(folder / "harbor-data"), "--relay-url", url],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=folder,
            preexec_fn=_dies_with_parent)
    return HarborServer(url, key, log), process


def _wait_ready(server: HarborServer, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None or time.monotonic() > deadline:
            raise HarborServeFailed(f"harbor serve did not start (see {server.log}): "
                                    + server.log.read_text()[-3000:])
        probe = urllib.request.Request(f"{server.url}/agents",
                                       headers={"Authorization": f"Bearer {server.api_key}"})
        with (contextlib.suppress(urllib.error.URLError, ConnectionError),
              urllib.request.urlopen(probe, timeout=5) as answer):
            if answer.status == 200:
                return
        time.sleep(0.5)


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def harbor_serve(folder: Path, ready_timeout: float = 120.0) -> Iterator[HarborServer]:
    """A running `harbor serve`, stopped at the end."""
    server, process = _spawn(folder)
    try:
        _wait_ready(server, process, ready_timeout)
        yield server
    finally:
        _stop(process)


@contextlib.asynccontextmanager
async def harbor_serving(folder: Path, ready_timeout: float = 120.0,
                         ) -> AsyncIterator[HarborServer]:
    """harbor_serve for a coroutine: started from the event loop's thread, waited for and
    stopped without blocking the loop."""
    server, process = _spawn(folder)
    try:
        await asyncio.to_thread(_wait_ready, server, process, ready_timeout)
        yield server
    finally:
        await asyncio.to_thread(_stop, process)
