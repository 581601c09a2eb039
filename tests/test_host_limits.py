"""What one sandbox may hold of the host process, and clean-up when the host has nothing left.

Attacks these stop (security round 4): an agent opening 1,100 idle connections to its relay
route, all accepted and never closed, until the host process ran out of file descriptors and
every other sandbox of the run failed to start (local: stop() then died with a TypeError in
remove_tree and left its folder; docker: "no Docker engine answers", masked as the task's);
idle, slow-head, slow-body, oversized and everlasting connections held on the route; a
sandbox's stop() crashing, and leaving its files, cgroup or container, once descriptors ran
out."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import resource
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from skyrl_agent.config import SandboxConfig
from skyrl_agent.descriptors import (
    HEADROOM,
    descriptors_left,
    fill_reserve,
    open_descriptors,
    out_of_descriptors,
    prepare,
    with_reserve,
)
from skyrl_agent.sandboxes.base import Sandbox, SandboxDied, SandboxSpec, create_sandbox
from skyrl_agent.sandboxes.local_disk import remove_tree
from skyrl_agent.sandboxes.loopback_route import LoopbackRoute, RouteLimits
from skyrl_agent.tasks import load_task
from tests.helpers import make_task
from tests.test_loopback_route import upstream  # noqa: F401

pytestmark = pytest.mark.slow
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the loopback route needs root")
FLOOD = r"""
import json, socket, sys, time
port, count = int(sys.argv[1]), int(sys.argv[2])
held, failed = [], 0
for _ in range(count):
    try:
        held.append(socket.create_connection(("127.0.0.1", port), timeout=2))
    except OSError:
        failed += 1
print(json.dumps({"held": len(held), "failed": failed}), flush=True)
time.sleep(30)
"""
PROBES = r"""
import json, socket, sys, threading, time
port = int(sys.argv[1])
out = {}


def connect():
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def ended(sock, within):
    # Seconds until the server closed the connection (None: still open), and what it said.
    start, said = time.monotonic(), b""
    sock.settimeout(0.1)
    while time.monotonic() - start < within:
        try:
            data = sock.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            data = b""
        if not data:
            return round(time.monotonic() - start, 1), said.decode(errors="replace")[:60]
        said += data
    return None, said.decode(errors="replace")[:60]


def idle():
    out["idle"] = ended(connect(), 8)


def slow_head():
    sock, start = connect(), time.monotonic()
    sock.sendall(b"POST /inference/v1 HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    while time.monotonic() - start < 8:
        try:
            sock.sendall(b"a")
        except OSError:
            break
        time.sleep(0.2)
    out["slow_head"] = ended(sock, 0.5)[0] is not None and round(time.monotonic() - start, 1)


def slow_body():
    sock = connect()
    sock.sendall(b"POST /inference/v1 HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123")
    out["slow_body"] = ended(sock, 8)


def oversized():
    sock = connect()
    body = b"x" * 5000
    sock.sendall(b"POST /inference/v1 HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
                 b"Connection: close\r\n\r\n" % len(body) + body)
    out["oversized"] = ended(sock, 8)


def busy():
    # Never idle: a request every 0.3 s on one connection, until the server ends it.
    sock, start, answered = connect(), time.monotonic(), 0
    sock.settimeout(2)
    while time.monotonic() - start < 10:
        try:
            sock.sendall(b"GET /inference/v1 HTTP/1.1\r\nHost: x\r\n\r\n")
            data = sock.recv(65536)
        except OSError:
            data = b""
        if not data:
            break
        answered += 1
        time.sleep(0.3)
    out["busy"] = [round(time.monotonic() - start, 1), answered]


threads = [threading.Thread(target=f) for f in (idle, slow_head, slow_body, oversized, busy)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(out))
"""


@pytest.fixture
def spec(tmp_path, sandbox_config) -> SandboxSpec:
    task = load_task(make_task(tmp_path, "host-limits", "echo 1 > /logs/verifier/reward.txt\n"))
    return dataclasses.replace(
        SandboxSpec.from_task(task, sandbox_config), memory_mb=512, pids_limit=64, deadline_s=180
    )


@pytest.fixture
def config(backend, work_root) -> SandboxConfig:
    return SandboxConfig(backend=backend, work_root=work_root)


@contextlib.contextmanager
def soft_open_file_limit(limit: int) -> Iterator[None]:
    """This process's soft open-file limit at `limit` meanwhile (the hard one stays: lowering
    it cannot be undone without CAP_SYS_RESOURCE)."""
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, before[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)


def exhaust(leave: int = 0) -> list[int]:
    """Open descriptors until this process has none left (but `leave`); close them after."""
    held: list[int] = []
    with contextlib.suppress(OSError):
        while True:
            held.append(os.open(os.devnull, os.O_RDONLY))
    for _ in range(min(leave, len(held))):
        os.close(held.pop())
    return held


def release(held: list[int]) -> None:
    for fd in held:
        os.close(fd)


def leftovers(sandbox: Sandbox, config: SandboxConfig) -> list[str]:
    """What a stopped sandbox left on the host."""
    if config.backend == "docker":
        name = sandbox.name  # type: ignore[attr-defined]
        listed = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"name={name}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        return [f"container {c}" for c in listed]
    assert config.work_root is not None
    left = [str(p) for p in config.work_root.iterdir()]
    mounts = [
        line
        for line in Path("/proc/mounts").read_text().splitlines()
        if f" {config.work_root}/" in line
    ]
    group = getattr(sandbox, "cgroup", None)
    cgroups = [] if group is None else [str(group)]
    return left + mounts + cgroups


async def finishes(spec: SandboxSpec, config: SandboxConfig, name: str) -> str:
    """A sandbox of another sample starts, runs a command and stops."""
    async with create_sandbox(dataclasses.replace(spec, name=name), config) as sandbox:
        result = await sandbox.exec("echo done", timeout=60)
    return result.stdout.strip()


@root_only
async def test_a_flood_of_connections_is_capped_and_ends_only_its_own_sandbox(
    spec,
    config,
    upstream,  # noqa: F811
):
    """1,100 idle connections from inside one sandbox, on a host whose open-file limit they
    would pass: the route holds at most its cap open, the sandbox that tried is ended (its
    sample's SandboxDied, reward 0), and other sandboxes start and finish meanwhile."""
    url, _ = upstream
    port = int(url.rsplit(":", 1)[1])
    cap = RouteLimits().connections
    with soft_open_file_limit(open_descriptors() + 700):
        async with create_sandbox(spec, config) as attacker:
            namespace = await asyncio.to_thread(attacker.network_namespace)
            async with LoopbackRoute(
                namespace, url, "/inference", on_violation=attacker.end
            ) as route:
                before = open_descriptors()
                command = shlex.join(["python3", "-c", FLOOD, str(port), "1100"])
                with pytest.raises(SandboxDied, match=f"more than {cap} connections") as died:
                    await attacker.exec(command, timeout=120)
                during = open_descriptors()
                others = await asyncio.gather(
                    *(finishes(spec, config, f"victim-{i}") for i in range(2))
                )
                with pytest.raises(SandboxDied):  # every later call says why
                    await attacker.exec("true", timeout=10)
    assert others == ["done", "done"]
    assert route.peak <= cap and route.turned_away >= 1, (route.peak, route.turned_away)
    assert route.violation is not None and route.violation in str(died.value)
    assert during - before <= 2 * cap + 8, (before, during)


@root_only
async def test_a_harbor_trial_whose_sandbox_floods_the_relay_is_that_samples_failure(
    tmp_path,
    backend,
    work_root,
    upstream,  # noqa: F811
):
    """Harbor's side: our environment ends the sandbox that passed its route's cap, the
    agent's command raises SandboxDied with the reason, and Harbor's record of it (the class
    name) is decided as the sample's failure: reward 0, kept, not retried."""
    from harbor.models.trial.paths import TrialPaths

    from skyrl_agent.harbor import SkyrlEnvironment
    from skyrl_agent.harbor.results import harbor_error, harbor_reward
    from skyrl_agent.types import FailureKind
    from tests.conftest import DEMO

    url, _ = upstream
    port = int(url.rsplit(":", 1)[1])
    task = load_task(DEMO / "hello-file")
    environment = SkyrlEnvironment(
        environment_dir=task.environment_dir,
        environment_name="hello",
        session_id="s",
        trial_paths=TrialPaths(trial_dir=tmp_path),
        task_env_config=task.config.environment,
        backend=backend,
        work_root=str(work_root),
        relay_url=f"{url}/inference",
    )
    await environment.start(force_build=False)
    try:
        flood = shlex.join(["python3", "-c", FLOOD, str(port), "1100"])
        with pytest.raises(SandboxDied, match="connections at once") as died:
            await environment.exec(flood, timeout_sec=120)
    finally:
        await environment.stop(delete=True)
    decided = harbor_error(type(died.value).__name__)
    assert decided.failure == FailureKind.SANDBOX_DIED and not decided.masked
    assert harbor_reward({"reward": 1.0}, "SandboxDied", decided).value == 0.0
    assert list(work_root.iterdir()) == []


@root_only
async def test_the_cap_alone_holds_while_the_flood_goes_on(
    spec,
    config,
    upstream,  # noqa: F811
):
    """The same flood, with nobody ending the sandbox: the route keeps at most its cap open
    and answers the rest 503, and other sandboxes start and finish while the flood holds."""
    url, _ = upstream
    port = int(url.rsplit(":", 1)[1])
    cap = RouteLimits().connections
    with soft_open_file_limit(open_descriptors() + 700):
        async with create_sandbox(spec, config) as attacker:
            namespace = await asyncio.to_thread(attacker.network_namespace)
            async with LoopbackRoute(namespace, url, "/inference") as route:
                before = open_descriptors()
                command = shlex.join(["python3", "-c", FLOOD, str(port), "1100"])
                flood = asyncio.create_task(attacker.exec(command, timeout=120))
                # Until the flood is over (a full backlog makes its connects retry after 1 s).
                seen, quiet = -1, 0
                while quiet < 6 and seen < 1100 and not flood.done():
                    await asyncio.sleep(0.5)
                    tried = route.accepted + route.turned_away
                    seen, quiet = tried, (quiet + 1 if tried == seen else 0)
                during = open_descriptors()
                others = await asyncio.gather(
                    *(finishes(spec, config, f"victim-{i}") for i in range(2))
                )
                held = route.open_connections
                flood.cancel()
    assert others == ["done", "done"]
    # A flood indeed (some of its connects time out while the backlog is full).
    assert route.accepted + route.turned_away > 10 * cap, (route.accepted, route.turned_away)
    assert route.peak <= cap and held == cap, (route.peak, held)
    assert during - before <= 2 * cap + 8, (before, during)


@root_only
async def test_routes_leave_the_host_its_headroom(
    spec,
    config,
    upstream,  # noqa: F811
):
    """Whatever the caps add up to, no route accepts while the process has HEADROOM
    descriptors or fewer left: a flood under a cap too high to matter stops there, and another
    sandbox still starts and finishes."""
    url, _ = upstream
    port = int(url.rsplit(":", 1)[1])
    prepare()  # done before: the limit below must stay as the test sets it
    with soft_open_file_limit(open_descriptors() + HEADROOM + 60):
        async with create_sandbox(spec, config) as attacker:
            namespace = await asyncio.to_thread(attacker.network_namespace)
            limits = RouteLimits(connections=1000)
            async with LoopbackRoute(namespace, url, "/inference", limits=limits) as route:
                command = shlex.join(["python3", "-c", FLOOD, str(port), "300"])
                flood = asyncio.create_task(attacker.exec(command, timeout=120))
                seen, quiet = -1, 0
                while quiet < 6 and not flood.done():
                    await asyncio.sleep(0.5)
                    seen, quiet = route.accepted, (quiet + 1 if route.accepted == seen else 0)
                left = descriptors_left()
                other = await finishes(spec, config, "victim")
                flood.cancel()
    assert other == "done"
    # The flood was held back (its other connections wait in the backlog or time out) once
    # the process came down to its headroom, which the route left to the host.
    assert 0 < route.accepted < 300 and left >= HEADROOM - 8, (route.accepted, left)


@root_only
async def test_idle_slow_oversized_and_everlasting_connections_are_ended(
    spec,
    config,
    upstream,  # noqa: F811
):
    """Connections an agent holds without using them: idle, a head that never ends, a body
    that never arrives, a body past the limit, and one kept busy forever."""
    url, seen = upstream
    port = int(url.rsplit(":", 1)[1])
    limits = RouteLimits(idle_s=1.0, connection_s=4.0, body_s=1.0, request_bytes=1000)
    async with create_sandbox(spec, config) as sandbox:
        namespace = await asyncio.to_thread(sandbox.network_namespace)
        async with LoopbackRoute(namespace, url, "/inference", limits=limits) as route:
            result = await sandbox.exec(
                shlex.join(["python3", "-c", PROBES, str(port)]), timeout=60
            )
            assert result.exit_code == 0, result.stderr
            out = json.loads(result.stdout)
    idle_s, _ = out["idle"]
    assert idle_s is not None and idle_s < 3, out
    assert out["slow_head"] and out["slow_head"] < 3.5, out
    body_s, said = out["slow_body"]
    assert body_s is not None and body_s < 3 and " 408 " in said, out
    _, said = out["oversized"]
    assert " 413 " in said, out
    busy_s, answered = out["busy"]
    assert 3.5 <= busy_s < 7 and answered >= 8, out
    # Idle ones are closed by the route's watchdog or aiohttp's keep-alive, whichever is first.
    assert route.closed_expired == 1 and route.too_large == 1 and route.violation is None, (
        route.closed_expired,
        route.too_large,
    )
    assert all(path == "/inference/v1" for path in seen)  # no partial request went upstream


async def test_stop_with_descriptors_exhausted_leaves_nothing(spec, config):
    """A sandbox stopped while this process has no descriptor left: stop() does not raise,
    and its folder, disk, cgroup or container are gone (the process's reserve is used)."""
    sandbox = create_sandbox(spec, config)
    await sandbox.start()
    await sandbox.exec(
        "mkdir -p /app/a/b/c && echo hi > /app/a/b/c/f && chmod 555 /app/a/b", timeout=30
    )
    held = exhaust()
    try:
        await sandbox.stop()
    finally:
        release(held)
    assert leftovers(sandbox, config) == []


def test_remove_tree_without_descriptors_raises_oserror_and_the_reserve_finishes_it(tmp_path):
    """rmtree's error handler called os.open(path) without flags once descriptors ran out:
    a TypeError that killed stop() and left the folder."""
    tree = tmp_path / "sandbox"
    (tree / "a" / "b" / "c").mkdir(parents=True)
    (tree / "a" / "b" / "c" / "f").write_text("x")
    fill_reserve()
    held = exhaust()
    try:
        with pytest.raises(OSError) as raised:
            remove_tree(tree)
        assert out_of_descriptors(raised.value)
        with_reserve(lambda: remove_tree(tree))
    finally:
        release(held)
    assert not tree.exists()


def test_the_open_file_soft_limit_is_raised_to_the_hard_one():
    """Linux starts a process at 1024 open files whatever its hard limit; the host raises it
    (CLI entry, `harbor run`'s environment, a sandbox's start) and takes its reserve."""
    probe = (
        "import resource; from skyrl_agent.descriptors import prepare, _reserve; "
        "prepare(); print(*resource.getrlimit(resource.RLIMIT_NOFILE), len(_reserve))"
    )
    done = subprocess.run(
        ["prlimit", "--nofile=1024:4096", sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split() == ["4096", "4096", "32"], done.stdout + done.stderr


@pytest.mark.docker
def test_an_engine_unreachable_for_want_of_descriptors_is_not_called_missing():
    """Out of descriptors, the engine was reported missing ("no Docker engine answers"): an
    UnsupportedEnvironment, masked as the task's. It is the host's now, and says so."""
    import docker  # noqa: F401 - imported before: reading its modules takes descriptors

    from skyrl_agent.sandboxes.base import SandboxError, UnsupportedEnvironment
    from skyrl_agent.sandboxes.docker import docker_client

    held = exhaust()
    try:
        with pytest.raises(SandboxError) as raised:
            docker_client()
    finally:
        release(held)
    assert not isinstance(raised.value, UnsupportedEnvironment)
    assert "out of file descriptors" in str(raised.value)


def test_a_sandbox_ended_in_a_harbor_trial_is_the_samples_failure():
    """Harbor records our SandboxDied by its class name, which its table does not know: it
    was retried and counted as the host's. It is the sample's: reward 0, kept, not retried."""
    from harbor.models.job.config import JobConfig

    from skyrl_agent.harbor.results import OWN_ERROR_POLICY, harbor_error, harbor_reward
    from skyrl_agent.types import FailureKind

    decided = harbor_error("SandboxDied")
    assert decided.failure == FailureKind.SANDBOX_DIED and not decided.masked
    assert harbor_reward({"reward": 1.0}, "SandboxDied", decided).value == 0.0
    job = JobConfig(override_error_policy=OWN_ERROR_POLICY)
    assert "SandboxDied" in (job.retry.exclude_exceptions or ())
