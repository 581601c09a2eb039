"""The sandbox work around an agent, off its critical path without losing a guarantee: the
verifier's sandbox starts while the agent works, a used sandbox is stopped in the background
(its processes ended at once, its folder gone once the pool closes), and a pre-started sandbox
that is not needed is stopped too."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from skyrl_agent.config import SandboxConfig, VerifierConfig
from skyrl_agent.envs.episode import AgentOutcome, run_episode
from skyrl_agent.sandboxes.base import Sandbox, SandboxError, SandboxSpec
from skyrl_agent.sandboxes.pool import SandboxPool
from skyrl_agent.tasks import find_task, load_task
from skyrl_agent.types import FailureKind, FinishReason
from tests.helpers import make_task


class Recorded:
    """A real pool that notes when each acquire returned a started sandbox, and its spec."""

    def __init__(self, pool: SandboxPool) -> None:
        self.pool, self.config = pool, pool.config
        self.started: list[tuple[float, SandboxSpec]] = []

    async def acquire(self, spec: SandboxSpec) -> Sandbox:
        sandbox = await self.pool.acquire(spec)
        self.started.append((time.monotonic(), spec))
        return sandbox

    async def acquire_spare(self, spec: SandboxSpec) -> Sandbox | None:
        sandbox = await self.pool.acquire_spare(spec)
        if sandbox is not None:
            self.started.append((time.monotonic(), spec))
        return sandbox

    async def release(self, sandbox: Sandbox) -> None:
        await self.pool.release(sandbox)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(os.geteuid() != 0, reason="host pids of a sandbox come from its cgroup (root)")
async def test_a_released_sandbox_ends_what_the_agent_left_at_once_and_close_waits_for_the_rest(
        work_root):
    # The attack: a process left running in the background that would keep going while the
    # stop is deferred (e.g. writing into the folder the verifier's bundle came from).
    config = SandboxConfig(work_root=work_root)
    pool = SandboxPool(config, size=0, stop_in_background=True)
    spec = SandboxSpec.from_task(find_task("demo/word-count"), config)
    sandbox, other = await pool.acquire(spec), await pool.acquire(spec)
    assert (await sandbox.exec("(while true; do sleep 0.01; done) >/dev/null 2>&1 &")).ok
    assert sandbox.cgroup is not None
    left = sandbox.cgroup.procs()
    assert left
    await pool.release(sandbox)
    assert pool._stops, "release waited for the whole stop"
    for _ in range(200):
        if not any(_alive(pid) for pid in left):
            break
        await asyncio.sleep(0.01)
    assert not any(_alive(pid) for pid in left)
    await pool.release(other)
    await pool.close()  # at once: the stop of `other` has not even begun
    assert list(work_root.iterdir()) == []  # unmounted and deleted before close returned


async def test_the_verifiers_sandbox_starts_while_the_agent_works(tmp_path, backend):
    task = load_task(make_task(tmp_path, "prestart", "[ \"$(cat /app/out.txt)\" = 42 ] && "
                               "echo 1 > /logs/verifier/reward.txt\n"))
    config = SandboxConfig(backend=backend)
    source = Recorded(SandboxPool(config, size=0, stop_in_background=True))
    acted: dict[str, float] = {}

    async def act(env) -> AgentOutcome:
        await env.exec("echo 42 > /app/out.txt", timeout=30)
        for _ in range(600):  # the second sandbox starts while we are still acting
            if len(source.started) == 2:
                break
            await asyncio.sleep(0.05)
        acted["done"] = time.monotonic()
        return AgentOutcome(FinishReason.STOP)

    try:
        episode = await run_episode(task, act, source, VerifierConfig())
    finally:
        await source.pool.close()
    assert episode.reward.value == 1.0, episode.reward.reason  # the bundle reached it
    (_, agent_spec), (verifier_ready, verifier_spec) = source.started
    assert verifier_ready < acted["done"]
    # It may wait as long as the agent's sandbox lives without eating the tests' time.
    assert verifier_spec.deadline_s == 2 * agent_spec.deadline_s
    assert episode.handover_time_s > 0 and episode.reward.verify_time_s > 0


@pytest.mark.parametrize("ending", ["failed", "cancelled"])
async def test_a_verifiers_sandbox_started_for_nothing_is_stopped(tmp_path, work_root, ending):
    task = load_task(make_task(tmp_path, "unused", "echo 1 > /logs/verifier/reward.txt\n"))
    source = Recorded(SandboxPool(SandboxConfig(work_root=work_root), size=0,
                                  stop_in_background=True))
    both_started = asyncio.Event()

    async def act(env) -> AgentOutcome:
        for _ in range(600):
            if len(source.started) == 2:
                break
            await asyncio.sleep(0.05)
        both_started.set()
        if ending == "failed":
            raise SandboxError("the engine went away")
        await asyncio.sleep(60)
        return AgentOutcome(FinishReason.STOP)

    episode = asyncio.create_task(run_episode(task, act, source, VerifierConfig()))
    await both_started.wait()
    if ending == "cancelled":
        episode.cancel()
    outcome = (await asyncio.gather(episode, return_exceptions=True))[0]
    if ending == "failed":
        assert outcome.outcome.failure is FailureKind.INFRA
    else:
        assert isinstance(outcome, asyncio.CancelledError)
    assert len(source.started) == 2
    await source.pool.close()
    assert list(work_root.iterdir()) == []  # neither sandbox is left


async def test_what_the_agent_deleted_stays_deleted_in_the_verifiers_sandbox(tmp_path, backend):
    # The verifier's sandbox starts with the task's files; the restore must first clear the
    # artifact paths (on the host for local sandboxes) or a deleted file would come back.
    dockerfile = "FROM ubuntu:24.04\nWORKDIR /app\nCOPY given.txt /app/sub/given.txt\n"
    test_sh = ("[ ! -e /app/sub/given.txt ] && [ \"$(cat /app/sub/new.txt)\" = n ] && "
               "echo 1 > /logs/verifier/reward.txt\n")
    task = load_task(make_task(tmp_path, "deleted", test_sh, dockerfile=dockerfile,
                               files={"given.txt": "g\n"}))
    pool = SandboxPool(SandboxConfig(backend=backend), size=0, stop_in_background=True)

    async def act(env) -> AgentOutcome:
        done = await env.exec("test -e /app/sub/given.txt && rm /app/sub/given.txt && "
                              "echo n > /app/sub/new.txt", timeout=30)
        assert done.ok, done.stderr
        return AgentOutcome(FinishReason.STOP)

    try:
        episode = await run_episode(task, act, pool, VerifierConfig())
    finally:
        await pool.close()
    assert episode.reward.value == 1.0, episode.reward.reason


def test_clearing_from_the_host_never_follows_a_link_out_of_the_sandbox(tmp_path):
    from skyrl_agent.sandboxes.artifacts import remove_tree_path
    from skyrl_agent.sandboxes.local_files import clear_on_host

    outside = tmp_path / "host"
    (outside / "data").mkdir(parents=True)
    (outside / "data" / "precious").write_text("p")
    root = tmp_path / "root"
    (root / "app" / "tree" / "deep").mkdir(parents=True)
    (root / "app" / "tree" / "deep" / "f").write_text("f")
    (root / "app" / "escape").symlink_to(outside)  # a folder on the way is a link
    (root / "app" / "link").symlink_to(outside / "data")  # the path itself is a link
    assert remove_tree_path(root, "/app/escape/data") is False  # left to rm inside
    assert remove_tree_path(root, "/app/link") is True
    assert not (root / "app" / "link").is_symlink() and (outside / "data" / "precious").exists()
    assert remove_tree_path(root, "/app/tree") is True and not (root / "app" / "tree").exists()
    assert remove_tree_path(root, "/app/missing") is True  # as rm -rf: nothing to do
    assert remove_tree_path(root, "/") is False and root.is_dir()
    assert clear_on_host(root, ["/usr/lib", "/app/escape/data", "/app"]) == [
        "/usr/lib", "/app/escape/data"]
    assert not (root / "app").exists() and (outside / "data" / "precious").exists()


async def test_a_bounded_pool_counts_a_sandbox_until_stopped_and_spares_only_a_free_slot(
        work_root):
    config = SandboxConfig(work_root=work_root)
    spec = SandboxSpec.from_task(find_task("demo/word-count"), config)
    pool = SandboxPool(config, size=0, stop_in_background=True, limit=1)
    try:
        held = await pool.acquire(spec)
        assert await pool.acquire_spare(spec) is None  # the only slot is taken
        await pool.release(held)
        assert await pool.acquire_spare(spec) is None  # still stopping: still counted
        await asyncio.gather(*pool._stops)
        spare = await pool.acquire_spare(spec)
        assert spare is not None
        waiting = asyncio.create_task(pool.acquire(spec))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # the bound holds
        await pool.release(spare)
        needed = await waiting  # the freed slot goes to who waits, never to a spare start
        assert await pool.acquire_spare(spec) is None
        await pool.release(needed)
    finally:
        await pool.close()
    assert list(work_root.iterdir()) == []
