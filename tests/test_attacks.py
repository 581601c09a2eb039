"""The agent as an adversary: each attack the security review found, on local and docker.

The agent is root in its sandbox. Forged rewards must be 0, the host must stay untouched, states
with links must store and re-grade, a sandbox the agent breaks must cost it reward 0 (never a
masked, retried sample), and a task's storage limit must hold.
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import io
import tarfile
import uuid

import pytest

from skyrl_agent.agents.oracle import OracleAgent
from skyrl_agent.collector.check import check_tasks
from skyrl_agent.collector.collector import Collector
from skyrl_agent.config import RunConfig, SandboxConfig, VerifierConfig
from skyrl_agent.data.store import TrajectoryStore
from skyrl_agent.evaluation.regrade import regrade
from skyrl_agent.sandboxes.artifacts import ArtifactLimits, BundleWriter, bundle_names
from skyrl_agent.sandboxes.base import SandboxDied, SandboxSpec, create_sandbox
from skyrl_agent.sandboxes.engine_archive import collect_tar_stream
from skyrl_agent.tasks import load_task
from skyrl_agent.types import FailureKind
from tests.attack_tasks import HONEST_TEST, make_attack_tasks
from tests.helpers import make_task

pytestmark = pytest.mark.slow


async def test_forged_rewards_score_zero_with_four_jobs(tmp_path, sandbox_config):
    """Every row of the review's table as a task, four at a time (the pool race must not
    interfere): forgeries 0, attacks that also solve the task 1."""
    expected = make_attack_tasks(tmp_path)
    tasks = [load_task(tmp_path / name.split("/")[1]) for name in expected]
    results = await check_tasks(tasks, "oracle", sandbox_config, jobs=4)
    got = {r.task: r.reward for r in results}
    assert got == expected, [(r.task, r.reward, r.reason) for r in results]


async def test_shared_mode_still_kills_what_the_agent_left(tmp_path, sandbox_config):
    """Harbor's shared mode (opt-in, weaker): lurking processes, a symlinked verifier folder and
    Python start-up hooks in the home still cannot forge a reward."""
    expected = make_attack_tasks(tmp_path)
    names = ["lurker", "reward-json-recreator", "verifier-dir-symlink", "python-hooks",
             "stdlib-shadow", "fork-past-timeout"]
    if sandbox_config.backend == "docker":
        names.remove("python-hooks")  # site-packages are writable in a container: shared is weak
    tasks = [load_task(tmp_path / name) for name in names]
    results = await check_tasks(tasks, "oracle", sandbox_config, jobs=2,
                                verifier=VerifierConfig(default_mode="shared"))
    assert {r.task: r.reward for r in results} == {f"test/{n}": expected[f"test/{n}"]
                                                   for n in names}


def _run_config(tmp_path, backend: str, **sandbox) -> RunConfig:
    return RunConfig(sandbox=SandboxConfig(backend=backend, **sandbox),
                     collector={"n_samples_per_task": 2, "max_concurrent_sandboxes": 2},
                     output_dir=tmp_path / "run")


async def test_link_states_store_and_regrade(tmp_path, backend):
    """Absolute links, a link loop and `..` links in the workdir: stored as links (never
    followed on the host) and re-graded to the same reward."""
    make_attack_tasks(tmp_path / "tasks")
    task = load_task(tmp_path / "tasks" / "symlinks")
    config = _run_config(tmp_path, backend)
    store = TrajectoryStore(tmp_path / "run", writable=True)
    groups = await Collector(config, OracleAgent, store).run([task], 1)
    trajectory = groups[0].trajectories[0]
    assert trajectory.reward.value == 1.0 and not trajectory.masked, trajectory.reward.reason
    state = store.run_dir / "final_state" / "test__symlinks#0.tar.gz"
    names = set(bundle_names(state.read_bytes()))
    assert {"app/root-link", "app/loop", "app/venv/bin/python"} <= names
    with tarfile.open(state) as archive:
        assert archive.getmember("app/root-link").linkname == "/"
    store.close()
    regraded = await regrade([trajectory], store.run_dir, config.sandbox, jobs=1,
                             tasks={task.name: task})
    assert regraded[0].regraded == 1.0, regraded[0].note


async def test_stdlib_shadow_scores_zero_on_regrade_too(tmp_path, backend):
    make_attack_tasks(tmp_path / "tasks")
    task = load_task(tmp_path / "tasks" / "stdlib-shadow")
    config = _run_config(tmp_path, backend)
    store = TrajectoryStore(tmp_path / "run", writable=True)
    trajectory = (await Collector(config, OracleAgent, store).run([task], 1))[0].trajectories[0]
    store.close()
    assert trajectory.reward.value == 0.0
    regraded = await regrade([trajectory], store.run_dir, config.sandbox, jobs=1,
                             tasks={task.name: task})
    assert regraded[0].regraded == 0.0, regraded[0].note


async def test_self_kill_scores_zero_unmasked(tmp_path, backend):
    """Signals at the sandbox's PID 1 are dropped: the agent cannot end its sandbox to turn a
    failure into a masked, retried sample."""
    make_attack_tasks(tmp_path / "tasks")
    task = load_task(tmp_path / "tasks" / "self-kill")
    store = TrajectoryStore(tmp_path / "run", writable=True)
    groups = await Collector(_run_config(tmp_path, backend), OracleAgent, store).run([task], 1)
    store.close()
    trajectory = groups[0].trajectories[0]
    assert trajectory.reward.value == 0.0 and not trajectory.masked
    assert trajectory.metrics["infra_retries"] == 0
    assert trajectory.reward.reason is None  # the tests ran and said 0


@pytest.mark.docker
async def test_container_killed_for_disk_is_the_agents_failure(tmp_path):
    """The one way left to end a container from inside (pass the storage limit): reward 0,
    failure sandbox_died, kept for training, not retried."""
    fill = "for i in 1 2 3 4; do fallocate -l 400M /app/f$i; done; sleep 5\n"
    task = load_task(make_task(tmp_path, "disk-death", HONEST_TEST, solve_sh=fill))
    config = _run_config(tmp_path, "docker", storage_mb=1024)
    store = TrajectoryStore(tmp_path / "run", writable=True)
    trajectory = (await Collector(config, OracleAgent, store).run([task], 1))[0].trajectories[0]
    store.close()
    assert trajectory.failure == FailureKind.SANDBOX_DIED, trajectory.reward.reason
    assert trajectory.reward.value == 0.0 and not trajectory.masked
    assert trajectory.metrics["infra_retries"] == 0


@pytest.fixture
def spec(tmp_path, sandbox_config) -> SandboxSpec:
    task = load_task(make_task(tmp_path, "limits", HONEST_TEST))
    return dataclasses.replace(SandboxSpec.from_task(task, sandbox_config), storage_mb=1024,
                               pids_limit=64, deadline_s=120)


async def test_storage_limit_holds(spec, sandbox_config):
    """A 4 GiB fill under storage_mb = 1024: one big file is refused, and many smaller ones
    stop at the limit (local: the disk is full; docker: the container is killed)."""
    async with create_sandbox(spec, sandbox_config) as sandbox:
        big = await sandbox.exec("fallocate -l 4G /app/big", timeout=30)
        assert big.exit_code != 0
        try:
            await sandbox.exec("for i in 1 2 3 4; do fallocate -l 1000M /app/f$i; done; "
                               "sleep 5", timeout=30)
            used = await sandbox.exec("du -sm /app | cut -f1", timeout=30)
            assert int(used.stdout) <= 1024
        except SandboxDied:
            assert sandbox_config.backend == "docker"


async def test_exec_server_cannot_be_signalled_traced_or_robbed(spec):
    """Local backend: agent commands run as the exec server's user, yet cannot stop it, attach
    to it, or take its pipes to the host (pidfd_getfd)."""
    steal = ("python3 -c \"import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
             "pidfd = os.pidfd_open(1); fd = libc.syscall(438, pidfd, 1, 0); "
             "print(fd, ctypes.get_errno())\"")
    async with create_sandbox(spec, SandboxConfig(backend="local")) as sandbox:
        stolen = await sandbox.exec(steal, timeout=30)
        fd, errno = (int(x) for x in stolen.stdout.split())
        assert fd == -1 and errno == 1  # EPERM
        proc_fd = await sandbox.exec("cat /proc/1/fd/1", timeout=10)
        assert proc_fd.exit_code != 0 and "denied" in proc_fd.stderr
        for signal in ("KILL", "STOP", "TERM", "INT", "ALRM", "HUP"):
            await sandbox.exec(f"kill -{signal} 1", timeout=10)
        await sandbox.exec("kill -9 -1", timeout=10)
        alive = await sandbox.exec("echo still here", timeout=10)
        assert alive.stdout == "still here\n"
    assert ctypes  # the attack uses ctypes inside the sandbox; the host needs none


async def test_output_flood_is_cut_on_the_host(spec, sandbox_config):
    """200 MB on stdout comes back as head and tail of max_output_bytes, on both backends."""
    async with create_sandbox(spec, sandbox_config) as sandbox:
        flood = await sandbox.exec("head -c 200000000 /dev/zero | tr '\\0' x", timeout=120)
    assert flood.ok
    assert len(flood.stdout) <= spec.max_output_bytes + 100
    assert "bytes cut" in flood.stdout


def _crafted_archive(sentinel: str) -> bytes:
    """A tar that would write outside any extraction folder if a host unpacked it."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        def add(name, kind=tarfile.REGTYPE, data=b"pwned", linkname=""):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, linkname
            info.size = len(data) if kind == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
        add("app", tarfile.DIRTYPE)
        add("app/ok.txt", data=b"fine")
        add(f"app/../../../..{sentinel}")
        add(sentinel)
        add("app/escape", tarfile.SYMTYPE, linkname="/tmp")
        add(f"app/escape/{sentinel.rsplit('/', 1)[1]}")
        add("app/hard", tarfile.LNKTYPE, linkname="/etc/passwd")
        add("app/dev", tarfile.CHRTYPE)
        add("other/file")
    return buffer.getvalue()


def test_crafted_archive_never_reaches_the_host(tmp_path):
    """CVE-2025-4517-style members (.., absolute names, a file through a link, hard links,
    devices) are dropped from the bundle; nothing is extracted on the host."""
    sentinel = f"/tmp/skyrl-pwned-{uuid.uuid4().hex}"
    data = _crafted_archive(sentinel)
    out = io.BytesIO()
    with BundleWriter(out, ArtifactLimits()) as writer:
        collect_tar_stream([data[i:i + 4096] for i in range(0, len(data), 4096)], "/app", writer)
    assert set(bundle_names(out.getvalue())) == {"app", "app/ok.txt", "app/escape"}
    with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as bundle:
        assert bundle.getmember("app/escape").issym()
    assert not any(p.name.startswith("skyrl-pwned") for p in (tmp_path.parent.glob("*")))
    import os
    assert not os.path.exists(sentinel)


def test_episode_attribution_of_a_dying_sandbox():
    """A sandbox that dies while the agent acts is the agent's failure; a start failure is the
    host's (unit level: the rule itself)."""
    from skyrl_agent.envs.episode import _act
    from skyrl_agent.sandboxes.base import SandboxError
    from skyrl_agent.types import FinishReason

    async def dies(env):
        raise SandboxDied("killed from inside")

    async def engine(env):
        raise SandboxError("engine went away")

    died = asyncio.run(_act(dies, None))  # type: ignore[arg-type]
    infra = asyncio.run(_act(engine, None))  # type: ignore[arg-type]
    assert died.failure == FailureKind.SANDBOX_DIED
    assert infra.failure == FailureKind.INFRA
    assert died.finish_reason == infra.finish_reason == FinishReason.SANDBOX_ERROR
