"""`harbor serve` (Harbor's job server, with its inference relay) on 127.0.0.1 for a run of ours
or a test: a key of its own (its REST, its relay and the connector's WebSocket all ask for it),
its data under the given folder, stopped at the end."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HARBOR = Path(sys.executable).parent / "harbor"


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


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def harbor_serve(folder: Path, ready_timeout: float = 120.0) -> Iterator[HarborServer]:
    port, key = free_port(), secrets.token_hex(16)
    url = f"http://127.0.0.1:{port}"
    log = folder / "harbor-serve.log"
    env = {**os.environ, "HARBOR_API_KEY": key, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(HARBOR), "serve", "--host", "127.0.0.1", "--port", str(port),
             "--data-dir", str(folder / "harbor-data"), "--relay-url", url],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=folder)
    try:
        deadline = time.monotonic() + ready_timeout
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                raise HarborServeFailed(f"harbor serve did not start (see {log}): "
                                        + log.read_text()[-3000:])
            probe = urllib.request.Request(f"{url}/agents",
                                           headers={"Authorization": f"Bearer {key}"})
            with (contextlib.suppress(urllib.error.URLError, ConnectionError),
                  urllib.request.urlopen(probe, timeout=5) as answer):
                if answer.status == 200:
                    break
            time.sleep(0.5)
        yield HarborServer(url, key, log)
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
