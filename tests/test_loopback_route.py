"""The loopback route: inside a real sandbox with no network, the relay's path on 127.0.0.1 is
served by the host, and nothing else of the host is reachable; read-only mounts stay read-only.

Attacks it stops: an agent in the sandbox calling the job server's other endpoints through the
relay's port (e.g. /jobs), climbing out of the relay's path with dot segments (raw or
percent-encoded), and reaching any other host port. test_sandbox_security.py checks the route
and read-only mounts on every backend."""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from skyrl_agent.config import SandboxConfig
from skyrl_agent.harbor.serve import free_port
from skyrl_agent.sandboxes.base import Sandbox, SandboxSpec, create_sandbox
from skyrl_agent.sandboxes.loopback_route import LoopbackRoute, forwardable

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the loopback route needs root")
CLIENT = """
import http.client, json, sys
out = {}
for method, path in json.loads(sys.argv[1]):
    try:
        connection = http.client.HTTPConnection("127.0.0.1", int(sys.argv[2]), timeout=10)
        connection.request(method, path, body=b'{"x": 1}' if method == "POST" else None,
                           headers={"Authorization": "Bearer token-1"})
        answer = connection.getresponse()
        out[path] = [answer.status, answer.read().decode()]
    except OSError as error:
        out[path] = [0, type(error).__name__]
print(json.dumps(out))
"""


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[str, list[str]]]:
    """A host HTTP service that answers every path with what it received, in three chunks."""
    seen: list[str] = []

    async def answer(request: web.Request) -> web.StreamResponse:
        seen.append(request.raw_path)
        body = json.dumps({"path": request.raw_path, "body": (await request.read()).decode(),
                           "auth": request.headers.get("Authorization")}).encode()
        response = web.StreamResponse()
        await response.prepare(request)
        for start in range(0, len(body), len(body) // 3 + 1):
            await response.write(body[start:start + len(body) // 3 + 1])
        return response

    app = web.Application()
    app.router.add_route("*", "/{path:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}", seen
    await runner.cleanup()


@pytest.fixture
async def sandbox(work_root) -> AsyncIterator[Sandbox]:
    async with create_sandbox(SandboxSpec(name="route", environment_dir=None, workdir="/"),
                              SandboxConfig(work_root=work_root)) as started:
        yield started


async def requests_from(sandbox: Sandbox, port: int, paths: list[tuple[str, str]]) -> dict:
    result = await sandbox.exec(shlex.join(["python3", "-c", CLIENT, json.dumps(paths), str(port)]),
                                timeout=60)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@root_only
async def test_only_the_relay_path_of_the_host_is_reachable_from_the_sandbox(
        sandbox, upstream):
    url, seen = upstream
    port = int(url.rsplit(":", 1)[1])
    other_port = free_port()  # a host service the sandbox must not reach at all
    async with LoopbackRoute(sandbox.network_namespace(), url, "/inference") as route:
        answers = await requests_from(sandbox, port, [
            ("POST", "/inference/r/1/v1/chat/completions"), ("GET", "/jobs"),
            ("POST", "/inference/../jobs"), ("POST", "/inference/%2e%2e/jobs"),
            ("POST", "/inferencejobs"), ("POST", "/inference/./v1")])
        elsewhere = await requests_from(sandbox, other_port, [("GET", "/")])
    status, body = answers["/inference/r/1/v1/chat/completions"]
    assert status == 200
    assert json.loads(body) == {"path": "/inference/r/1/v1/chat/completions",
                                "body": '{"x": 1}', "auth": "Bearer token-1"}
    refused = [path for path, (code, _) in answers.items() if code == 404]
    assert sorted(refused) == sorted(["/jobs", "/inference/../jobs", "/inference/%2e%2e/jobs",
                                      "/inferencejobs", "/inference/./v1"])
    assert seen == ["/inference/r/1/v1/chat/completions"]  # nothing refused reached the host
    assert (route.forwarded, route.refused) == (1, 5)
    assert elsewhere["/"][0] == 0  # connection refused: no route to any other host port


@root_only
async def test_a_route_ends_with_its_context(sandbox, upstream):
    url, _ = upstream
    port = int(url.rsplit(":", 1)[1])
    async with LoopbackRoute(sandbox.network_namespace(), url, "/inference"):
        pass
    after = await requests_from(sandbox, port, [("POST", "/inference/v1")])
    assert after["/inference/v1"][0] == 0


def test_forwardable_paths_stay_under_the_prefix():
    assert forwardable("/inference", "/inference")
    assert forwardable("/inference/v1/messages", "/inference")
    for path in ("/", "/inferencex", "/inference/../x", "/inference/%2E%2E/x", "/x/inference",
                 "/inference/./v1", "/inference/a/../../x"):
        assert not forwardable(path, "/inference"), path


@pytest.mark.parametrize("mount", [{"app": "/tmp"}, {"/opt/../etc": "/tmp"},
                                   {"/opt/x": "relative"}])
def test_a_mount_needs_absolute_paths_without_dot_dot(mount):
    with pytest.raises(ValueError, match="absolute"):
        SandboxSpec(name="m", environment_dir=None, read_only_mounts=mount)


@pytest.mark.parametrize("host", ["/", "/tmp", "/dev", "/dev/shm"])
def test_no_mount_shows_the_runs_private_folders(host, tmp_path):
    """A task's mount of the temporary folder (or one above it) would hand a Docker sandbox's
    root vLLM's socket, whose 0700 folder it does not respect; /dev/shm holds weight files."""
    with pytest.raises(ValueError, match="sockets and weight files"):
        SandboxSpec(name="m", environment_dir=None, read_only_mounts={"/opt/x": host})
    SandboxSpec(name="m", environment_dir=None, read_only_mounts={"/opt/x": str(tmp_path)})
