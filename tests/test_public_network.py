"""Public local sandboxes reach out, but never the host's loopback (model server, Tinker, Ray).

The network here reaches no outside host, so a server bound on this machine's own non-loopback
address stands in for the internet: from a sandbox it is as far away as any outside address.
"""

from __future__ import annotations

import dataclasses
import functools
import http.server
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from skyrl_agent.config import SandboxConfig
from skyrl_agent.sandboxes.base import SandboxSpec, UnsupportedEnvironment, create_sandbox
from skyrl_agent.tasks import load_task
from tests.helpers import make_task

pytestmark = pytest.mark.slow
LOCAL = SandboxConfig(backend="local")
FETCH = ("python3 -c \"import sys, urllib.request; "
         "print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())\" {url}")


class _Answer(http.server.BaseHTTPRequestHandler):
    def __init__(self, *args, token: str, **kwargs) -> None:
        self.token = token
        super().__init__(*args, **kwargs)

    def do_GET(self) -> None:
        body = self.token.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@dataclasses.dataclass(frozen=True)
class _Server:
    url: str
    port: int
    token: str


def _own_address() -> str:
    """This machine's first global IPv4 address (its own interface, no other host's)."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"],
                         capture_output=True, text=True).stdout.split()
    if "inet" not in out:
        pytest.skip("this machine has no non-loopback IPv4 address")
    return out[out.index("inet") + 1].split("/")[0]


@pytest.fixture
def serve() -> Iterator:
    servers: list[http.server.ThreadingHTTPServer] = []

    def start(host: str, token: str) -> _Server:
        handler = functools.partial(_Answer, token=token)
        server = http.server.ThreadingHTTPServer((host, 0), handler)
        servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        port = server.server_address[1]
        return _Server(f"http://{host}:{port}/", port, token)

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _spec(tmp_path: Path, network: bool) -> SandboxSpec:
    task = load_task(make_task(tmp_path, "net", "echo 1 > /logs/verifier/reward.txt\n"))
    return dataclasses.replace(SandboxSpec.from_task(task, LOCAL), network=network,
                               memory_mb=256, pids_limit=64, deadline_s=120)


def _network_helpers() -> set[str]:
    """slirp4netns processes this test process started and still has."""
    out = subprocess.run(["ps", "-eo", "ppid=,comm="], capture_output=True, text=True).stdout
    return {line for line in out.splitlines()
            if line.split()[0] == str(os.getpid()) and "slirp4netns" in line}


async def test_public_sandbox_reaches_out_but_not_the_host_loopback(tmp_path, serve):
    """Stops an agent in a public task from calling the services on the host's loopback (the
    embedded model server, the Tinker server, Ray), which it reached when the sandbox shared the
    host's network namespace; it still reaches addresses outside the machine's loopback."""
    inside_only = serve("127.0.0.1", "host-loopback-service")
    outside = serve(_own_address(), "outside-service")
    async with create_sandbox(_spec(tmp_path, network=True), LOCAL) as sandbox:
        reached = await sandbox.exec(FETCH.format(url=outside.url), timeout=30)
        loopback = await sandbox.exec(FETCH.format(url=inside_only.url), timeout=30)
        # slirp4netns's alias of the host's loopback must be closed too.
        alias = await sandbox.exec(FETCH.format(url=f"http://10.0.2.2:{inside_only.port}/"),
                                   timeout=30)
        helpers = _network_helpers()
    assert reached.ok and reached.stdout.strip() == outside.token, reached.stderr
    for attempt in (loopback, alias):
        assert not attempt.ok and inside_only.token not in attempt.stdout
    assert helpers and not _network_helpers()  # the network helper ends with its sandbox


async def test_private_sandbox_has_no_network(tmp_path, serve):
    """Guards the default: a task without network access reaches neither the host's loopback
    services nor any other address, and has no interface but its own loopback."""
    inside_only = serve("127.0.0.1", "host-loopback-service")
    outside = serve(_own_address(), "outside-service")
    async with create_sandbox(_spec(tmp_path, network=False), LOCAL) as sandbox:
        results = [await sandbox.exec(FETCH.format(url=s.url), timeout=30)
                   for s in (inside_only, outside)]
        devices = await sandbox.exec("cat /proc/net/dev", timeout=10)
    for result, server in zip(results, (inside_only, outside), strict=True):
        assert not result.ok and server.token not in result.stdout
    assert [line.split(":")[0].strip() for line in devices.stdout.splitlines()[2:]] == ["lo"]


async def test_public_sandbox_without_slirp4netns_says_so(tmp_path, monkeypatch):
    """Stops a public task from starting without its user-mode network (the old fallback
    shared the host's network namespace): one line says what to install."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "bwrap").symlink_to(shutil.which("bwrap") or "/missing/bwrap")
    monkeypatch.setenv("PATH", str(bin_dir))
    with pytest.raises(UnsupportedEnvironment, match="apt-get install slirp4netns"):
        async with create_sandbox(_spec(tmp_path, network=True), LOCAL):
            pass
