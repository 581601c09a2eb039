"""A real `harbor serve` (Harbor's job server, with its inference relay) on 127.0.0.1 for a
test: a key of its own, its data in a temporary folder, stopped at the end."""

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
    url: str
    api_key: str
    log: Path


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
            assert process.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
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
