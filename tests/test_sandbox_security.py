"""Security properties every sandbox backend must have, checked on local and docker alike."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from skyrl_agent.config import SandboxConfig
from skyrl_agent.sandboxes.base import SandboxError, SandboxSpec, create_sandbox
from skyrl_agent.tasks import load_task
from tests.helpers import make_task
from tests.test_loopback_route import upstream  # noqa: F401

pytestmark = pytest.mark.slow


def _host_processes(marker: str) -> list[str]:
    """Host processes whose command line holds `marker` (container processes are visible too)."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if marker in line and "ps -eo" not in line]


async def _wait_gone(marker: str, seconds: float = 10) -> list[str]:
    for _ in range(int(seconds * 10)):
        left = _host_processes(marker)
        if not left:
            return []
        await asyncio.sleep(0.1)
    return _host_processes(marker)


@pytest.fixture
def spec(tmp_path, sandbox_config) -> SandboxSpec:
    task = load_task(make_task(tmp_path, "secure", "echo 1 > /logs/verifier/reward.txt\n"))
    return dataclasses.replace(SandboxSpec.from_task(task, sandbox_config), memory_mb=256,
                               pids_limit=64, deadline_s=120)


async def test_no_network(spec, sandbox_config):
    probe = ("python3 -c \"import socket; s=socket.socket(); s.settimeout(3); "
             "s.connect(('1.1.1.1', 53)); print('connected')\"")
    async with create_sandbox(spec, sandbox_config) as sandbox:
        result = await sandbox.exec(probe, timeout=20)
        interfaces = await sandbox.exec("cat /proc/net/dev", timeout=10)
    assert "connected" not in result.stdout
    assert result.exit_code != 0
    assert "unreachable" in result.stderr.lower() or "errno" in result.stderr.lower()
    # Only the loopback device exists inside.
    devices = [line.split(":")[0].strip() for line in interfaces.stdout.splitlines()[2:]]
    assert devices == ["lo"]


async def test_no_writes_outside_the_sandbox(spec, sandbox_config, tmp_path):
    host_dir = tmp_path / "host-visible"
    host_dir.mkdir()
    async with create_sandbox(spec, sandbox_config) as sandbox:
        usr = await sandbox.exec("touch /usr/pwned", timeout=10)
        etc = await sandbox.exec("echo x >> /etc/passwd", timeout=10)
        escape = await sandbox.exec(f"mkdir -p {host_dir} && touch {host_dir}/pwned", timeout=10)
        own = await sandbox.exec("echo ok > /app/mine && cat /app/mine", timeout=10)
    # The host is untouched on every backend (a container may write its own copy of /usr).
    assert not os.path.exists("/usr/pwned")
    with open("/etc/passwd") as passwd:
        assert "x" not in passwd.read().splitlines()
    assert not (host_dir / "pwned").exists()
    assert own.ok and own.stdout.strip() == "ok"
    if sandbox_config.backend == "local":  # host system dirs are mounted read-only
        assert usr.exit_code != 0 and etc.exit_code != 0
    assert escape.exit_code == 0 or "denied" in escape.stderr.lower() or escape.stderr


async def test_host_secrets_and_environment_are_invisible(spec, sandbox_config, tmp_path,
                                                          monkeypatch):
    secret = f"secret-{uuid.uuid4().hex}"
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text(secret)
    home_secret = os.path.expanduser(f"~/.skyrl-test-secret-{uuid.uuid4().hex[:6]}")
    with open(home_secret, "w") as handle:
        handle.write(secret)
    monkeypatch.setenv("SKYRL_TEST_API_KEY", secret)
    try:
        async with create_sandbox(spec, sandbox_config) as sandbox:
            read_tmp = await sandbox.exec(f"cat {secret_file}", timeout=10)
            read_home = await sandbox.exec(f"cat {home_secret}", timeout=10)
            grep = await sandbox.exec(
                f"grep -rs {secret} / --exclude-dir=proc --exclude-dir=sys | head -1", timeout=60)
            env = await sandbox.exec("env; cat /proc/1/environ | tr '\\0' '\\n'", timeout=10)
    finally:
        os.unlink(home_secret)
    assert read_tmp.exit_code != 0 and secret not in read_tmp.stdout
    assert read_home.exit_code != 0 and secret not in read_home.stdout
    assert secret not in grep.stdout
    assert secret not in env.stdout and "SKYRL_TEST_API_KEY" not in env.stdout


@pytest.mark.serial
async def test_fork_bomb_is_contained_and_cleaned_up(spec, sandbox_config):
    marker = f"bomb{uuid.uuid4().hex[:8]}"
    bomb = f"{marker}() {{ {marker} | {marker} & }}; {marker}"
    peak = 0
    async with create_sandbox(spec, sandbox_config) as sandbox:
        running = asyncio.create_task(sandbox.exec(bomb, timeout=8))
        while not running.done():
            peak = max(peak, len(_host_processes(marker)))
            await asyncio.sleep(0.2)
        running.result()  # the call itself returns (no hang, no crash)
    assert 0 < peak <= spec.pids_limit
    assert await _wait_gone(marker) == []


@pytest.mark.serial
async def test_memory_hog_is_stopped_at_its_limit(spec, sandbox_config):
    hog = "python3 -c \"b = bytearray(1024 * 1024 * 1024); print('allocated', len(b))\""
    async with create_sandbox(spec, sandbox_config) as sandbox:
        result = await sandbox.exec(hog, timeout=60)
        after = await sandbox.exec("echo alive", timeout=30)
    assert "allocated" not in result.stdout
    assert result.exit_code != 0
    assert after.stdout.strip() == "alive"


async def test_deadline_kills_everything(spec, sandbox_config):
    marker = f"100{uuid.uuid4().int % 10**6:06d}"
    short = dataclasses.replace(spec, deadline_s=4)
    sandbox = create_sandbox(short, sandbox_config)
    await sandbox.start()
    try:
        await sandbox.exec(f"nohup setsid sleep {marker} >/dev/null 2>&1 &", timeout=5)
        assert _host_processes(f"sleep {marker}"), "background sleep should be running"
        try:  # at the deadline the call either reports a timeout or finds the sandbox gone
            result = await sandbox.exec(f"sleep {marker}", timeout=None)
            assert result.timed_out
        except SandboxError as exc:
            assert "deadline" in str(exc) or "died" in str(exc)
        assert await _wait_gone(f"sleep {marker}", seconds=15) == []
        with pytest.raises(SandboxError):
            await sandbox.exec("true", timeout=5)
    finally:
        await sandbox.stop()


async def test_stop_leaves_no_process(spec, sandbox_config):
    marker = f"200{uuid.uuid4().int % 10**6:06d}"
    sandbox = create_sandbox(spec, sandbox_config)
    await sandbox.start()
    await sandbox.exec(f"nohup setsid sleep {marker} >/dev/null 2>&1 &", timeout=5)
    assert _host_processes(f"sleep {marker}")
    await sandbox.stop()
    assert await _wait_gone(f"sleep {marker}") == []



def _sandbox_reading(replies: bytes):
    """A local sandbox whose exec-server pipe holds `replies` (no process behind it)."""
    from skyrl_agent.sandboxes.local import LocalSandbox

    class FakeProcess:
        returncode = None
        pid = 0  # no process of ours: nothing to signal
        stdout = asyncio.StreamReader()

        def kill(self):
            self.returncode = -9

    sandbox = LocalSandbox(SandboxSpec(name="forged", environment_dir=None))
    sandbox._proc = FakeProcess()  # type: ignore[assignment]
    sandbox._proc.stdout.feed_data(replies)
    sandbox._proc.stdout.feed_eof()
    return sandbox


@pytest.mark.parametrize("garbage", [
    b"1 0 0 0.1 99999999999999 0\n",           # absurd length
    b"\x80\x04\x95 not a header at all\n",     # binary junk (e.g. a pickle/marshal payload)
    b"1 0 0 zero 0 0\n",                        # a field that is not a number
])
async def test_forged_exec_replies_end_the_sandbox_not_the_host(garbage):
    # Whatever writes to the exec server's reply pipe must not make the host parse objects:
    # a malformed reply marks the sandbox dead, and callers get a SandboxError.
    sandbox = _sandbox_reading(garbage)
    pending = asyncio.get_running_loop().create_future()
    sandbox._pending[1] = pending
    await sandbox._read_replies()
    with pytest.raises(SandboxError, match="malformed reply"):
        pending.result()


async def test_a_reply_to_a_request_never_sent_ends_the_sandbox():
    # The host takes only replies to its own (random) request ids.
    sandbox = _sandbox_reading(b"7 0 0 0.1 2 0\n1\n")
    pending = asyncio.get_running_loop().create_future()
    sandbox._pending[123456789] = pending
    await sandbox._read_replies()
    with pytest.raises(SandboxError, match="never sent"):
        pending.result()


async def test_a_lingering_background_child_ends_at_the_timeout(spec, sandbox_config):
    # The shell exits at once but its child keeps the output pipe: the call returns at its
    # timeout with what was printed, and the sandbox keeps answering.
    async with create_sandbox(spec, sandbox_config) as sandbox:
        lingering = await sandbox.exec("echo started; (sleep 300 &)", timeout=2)
        after = await sandbox.exec("echo next", timeout=10)
    assert lingering.stdout.startswith("started")
    assert after.stdout == "next\n"


@pytest.mark.docker
def test_the_docker_reaper_skips_a_container_removed_while_it_looks(monkeypatch):
    """Two runs on one engine: a live run removes its container between the reaper's listing
    and its look at it (seen with two test workers: `tasks check` ended in a traceback). The
    reaper still removes the expired container and raises nothing."""
    import docker
    from docker.api.client import APIClient

    from skyrl_agent.sandboxes.docker import LABEL, reap_expired_containers

    client = docker.from_env()
    labels = {LABEL: "1", f"{LABEL}.deadline": "1"}  # expired long ago: a killed run's
    expired = client.containers.create("skyrl-agent/base:bookworm", ["true"], labels=labels)
    live = client.containers.create("skyrl-agent/base:bookworm", ["true"], labels={
        LABEL: "1", f"{LABEL}.deadline": str(time.time() + 3600)})
    listing = APIClient.containers

    def listed_then_stopped(self, *args, **kwargs):
        found = listing(self, *args, **kwargs)
        with contextlib.suppress(docker.errors.NotFound):
            live.remove(force=True)  # its run stops it now
        return found

    monkeypatch.setattr(APIClient, "containers", listed_then_stopped)
    try:
        assert reap_expired_containers() >= 1
        with pytest.raises(docker.errors.NotFound):
            client.containers.get(expired.id)
    finally:
        for container in (expired, live):
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)


async def test_a_killed_runs_local_sandbox_is_reaped():
    # A run killed with kill -9 leaves its sandbox (processes, cgroup, mounted disk, folder),
    # maybe half removed: the next command's reaper removes it, and leaves live runs' alone.
    import sys
    import tempfile
    import textwrap
    from pathlib import Path

    from skyrl_agent.sandboxes.local_disk import reap_stale_sandboxes

    work_root = Path(tempfile.mkdtemp(prefix="skyrl-reap-"))  # reachable by the sandbox user
    script = textwrap.dedent(f"""
        import asyncio, os, sys
        from pathlib import Path
        from skyrl_agent.config import SandboxConfig
        from skyrl_agent.sandboxes.base import SandboxSpec, create_sandbox
        async def main():
            config = SandboxConfig(work_root=Path({str(work_root)!r}))
            sandbox = create_sandbox(SandboxSpec(name="orphan", environment_dir=None,
                                                 workdir="/app"), config)
            await sandbox.start()
            await sandbox.exec("setsid sleep 4242 > /dev/null 2>&1 &", timeout=10)
            print("ready", flush=True)
            await asyncio.sleep(600)
        asyncio.run(main())
    """)
    work_root.chmod(0o755)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    assert child.stdout.readline().strip() == b"ready"
    live = SandboxSpec(name="live", environment_dir=None, workdir="/app")
    async with create_sandbox(live, SandboxConfig(work_root=work_root)):
        assert reap_stale_sandboxes(work_root) == 0  # both owners still run
        child.kill()
        child.wait()
        # Say the run was killed while it removed its sandbox: what was a file in its folder
        # is gone already. What names the owner must outlive that, or the folder stays forever.
        [orphan] = [f for f in work_root.iterdir() if "orphan" in f.name]
        for leftover in orphan.iterdir():
            if leftover.is_file():
                leftover.unlink()
        assert reap_stale_sandboxes(work_root) == 1
        assert len(list(work_root.iterdir())) == 1  # only the live one is left
    assert list(work_root.iterdir()) == []
    work_root.rmdir()
    assert await _wait_gone("sleep 4242") == []


def test_an_abandoned_cgroup_is_found_and_a_live_one_is_not():
    """A cgroup whose sandbox folder is gone (a crash inside stop()) is reaped once empty."""
    import uuid

    from skyrl_agent.sandboxes.cgroups import Cgroup, abandoned_cgroups, cgroups_available

    if not cgroups_available():
        pytest.skip("needs writable cgroup v1 controllers (root)")
    empty = Cgroup.create(f"abandoned-{uuid.uuid4().hex[:8]}", 64, 16, 0.5)
    busy = Cgroup.create(f"busy-{uuid.uuid4().hex[:8]}", 64, 16, 0.5)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        for path in busy.procs_files:
            path.write_text(str(sleeper.pid))
        names = {group.name for group in abandoned_cgroups(min_age_s=0)}
        assert empty.name in names and busy.name not in names
        assert empty.name not in {group.name for group in abandoned_cgroups(min_age_s=3600)}
    finally:
        sleeper.kill()
        sleeper.wait()
        assert empty.remove() and busy.remove()


@pytest.mark.skipif(os.geteuid() != 0, reason="the loopback route needs root")
async def test_a_read_only_mount_and_the_relay_route_hold_on_every_backend(
        spec, sandbox_config, upstream):  # noqa: F811
    """What a Harbor agent inside the sandbox is given (toolchains.py, loopback_route.py): a
    mounted folder it cannot write through, and the relay's path on 127.0.0.1, nothing else."""
    import tempfile

    from skyrl_agent.sandboxes.loopback_route import LoopbackRoute
    from tests.test_loopback_route import requests_from

    # Under a folder only root may enter (as a checkout under root's home is): the sandbox's
    # unprivileged user could not reach it by its path.
    private = Path(tempfile.mkdtemp(prefix="skyrl-private-"))
    assert private.stat().st_mode & 0o077 == 0
    toolchain = private / "toolchain"
    toolchain.mkdir(mode=0o755)
    (toolchain / "tool").write_text("v1\n")
    (toolchain / "tool").chmod(0o666)  # writable by anyone: only the mount may stop a write
    url, seen = upstream
    port = int(url.rsplit(":", 1)[1])
    mounted = dataclasses.replace(spec, read_only_mounts={"/opt/tool": str(toolchain)})
    try:
        async with create_sandbox(mounted, sandbox_config) as sandbox:
            read = await sandbox.exec("cat /opt/tool/tool", timeout=30)
            write = await sandbox.exec("echo forged > /opt/tool/tool; touch /opt/tool/new",
                                       timeout=30)
            namespace = await asyncio.to_thread(sandbox.network_namespace)
            async with LoopbackRoute(namespace, url, "/inference"):
                answers = await requests_from(sandbox, port, [("POST", "/inference/v1"),
                                                              ("GET", "/jobs")])
        unchanged = (toolchain / "tool").read_text() == "v1\n"
        listed = sorted(p.name for p in toolchain.iterdir())
    finally:
        shutil.rmtree(private)
    assert read.stdout == "v1\n" and write.exit_code != 0
    assert "Read-only" in write.stdout + write.stderr
    assert unchanged and listed == ["tool"]
    assert answers["/inference/v1"][0] == 200 and answers["/jobs"][0] == 404
    assert seen == ["/inference/v1"]
