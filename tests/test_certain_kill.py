"""The kill before verification is certain: a fork bomb cannot outlast it, even under load.

Attack (issue 28): the agent solves the task, then leaves a fork bomb running past its command's
`timeout`. Killing by rounds of signals raced the forks and gave up ("processes could not be
killed"; on the local backend the exec server had no room left under the pids limit even for the
thread that kills): the sample scored 0 although the agent did the task. Freezing the sandbox's
cgroup before one SIGKILL pass ends the bomb in one step, on both backends.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import subprocess
import time

import pytest

from skyrl_agent.collector.check import check_tasks
from skyrl_agent.sandboxes.base import SandboxSpec, create_sandbox
from skyrl_agent.sandboxes.cgroups import CGROUP_ROOT, PARENT
from skyrl_agent.tasks import load_task
from tests.attack_tasks import ATTACKS, HONEST_TEST, SYMLINKS
from tests.helpers import make_task
from tests.test_sandbox_security import _host_processes, _wait_gone

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # fork bombs: a load that starves a neighbour

# Eight processes that fork for ever and retry at once whenever the pids limit refuses: the
# sandbox stays at its limit while signals race the forks.
BOMB = r"""cat > /tmp/bomb-{mark}.py <<'END'
import os, time
while True:
    try:
        if os.fork() == 0:
            time.sleep(3600)
            os._exit(0)
    except OSError:
        pass
END
for i in 1 2 3 4 5 6 7 8; do setsid python3 /tmp/bomb-{mark}.py < /dev/null > /dev/null 2>&1 & done
"""
OTHERS = {"lurker": 0.0, "reward-json-recreator": 0.0, "self-kill": 0.0, "symlinks": 1.0}


def _leftovers(mark: str, backend: str) -> list[str]:
    """Cgroups (local) or containers (docker) whose name holds `mark`."""
    found = [str(p) for p in CGROUP_ROOT.glob(f"*/{PARENT}/*{mark}*")]
    if backend == "docker":
        found += subprocess.run(["docker", "ps", "-aq", "--filter", f"name={mark}"],
                                capture_output=True, text=True).stdout.split()
    return found


async def test_fork_bombs_keep_their_reward_four_at_a_time(tmp_path, sandbox_config):
    """Four fork bombs past their timeout, four at a time beside other attacks: each keeps its
    reward 1.0 (never "processes could not be killed"), the forgeries still score 0, and nothing
    is left running: no process, no cgroup, no container."""
    mark = str(random.randrange(100000, 999999))
    expected = {}
    for i in range(4):
        solve = "echo 42 > /app/answer.txt\n" + BOMB.format(mark=mark) + "sleep 3\n"
        make_task(tmp_path, f"bomb-{mark}-{i}", HONEST_TEST, solve_sh=solve)
        expected[f"test/bomb-{mark}-{i}"] = 1.0
    for name, reward in OTHERS.items():
        solve = SYMLINKS if name == "symlinks" else ATTACKS[name]
        make_task(tmp_path, f"{name}-{mark}", HONEST_TEST, solve_sh=solve)
        expected[f"test/{name}-{mark}"] = reward
    tasks = [load_task(tmp_path / name.split("/")[1]) for name in expected]
    results = await check_tasks(tasks, "oracle", sandbox_config, jobs=4)
    got = {r.task: r.reward for r in results}
    assert got == expected, [(r.task, r.reward, r.reason) for r in results]
    assert await _wait_gone(f"bomb-{mark}", seconds=30) == []
    assert _leftovers(mark, sandbox_config.backend) == []


async def test_fork_bomb_held_at_its_pids_limit_dies_in_one_kill(tmp_path, sandbox_config):
    """The pids limit holds a live fork bomb (seen from the host), one kill_processes ends all of
    it while the sandbox lives on, and stop() leaves no cgroup or container behind. On docker the
    bomb holds the limit for 20 s: longer than a shell retries a refused fork (about 15 s), which
    ended a container whose PID 1 forked to wait (the honest sample then scored 0)."""
    mark = str(random.randrange(100000, 999999))
    task = load_task(make_task(tmp_path, f"held-{mark}", HONEST_TEST))
    spec = dataclasses.replace(SandboxSpec.from_task(task, sandbox_config), pids_limit=64)
    async with create_sandbox(spec, sandbox_config) as sandbox:
        await sandbox.exec(BOMB.format(mark=mark), timeout=30)
        for _ in range(100):  # until the limit refuses it
            if len(_host_processes(f"bomb-{mark}")) >= 48:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(20 if sandbox_config.backend == "docker" else 1)
        assert 48 <= len(_host_processes(f"bomb-{mark}")) <= 64
        await sandbox.kill_processes()
        assert _host_processes(f"bomb-{mark}") == []
        alive = await sandbox.exec("echo alive", timeout=30)
        assert alive.stdout == "alive\n", alive
    assert _leftovers(mark, sandbox_config.backend) == []


def test_cgroup_v2_freeze_ends_forking_processes_too():
    """The same race (forks refilling a group while it is killed) on hosts with only cgroup v2,
    where a docker engine puts containers in v2 cgroups: frozen through cgroup.freeze, killed in
    one pass. The processes bound their own number: a v2 group here has no pids controller."""
    from skyrl_agent.sandboxes.cgroups import end_processes

    unified = CGROUP_ROOT if (CGROUP_ROOT / "cgroup.controllers").is_file() else (
        CGROUP_ROOT / "unified")
    if os.geteuid() != 0 or not (unified / "cgroup.procs").is_file():
        pytest.skip("needs root and a cgroup v2 hierarchy")
    group = unified / PARENT / f"v2-{random.randrange(100000, 999999)}"
    group.mkdir(parents=True)
    forker = ("import os, time\nalive = set()\nwhile True:\n    if len(alive) < 40:\n"
              "        pid = os.fork()\n        if pid == 0:\n            time.sleep(3600)\n"
              "            os._exit(0)\n        alive.add(pid)\n"
              "    pid, _ = os.waitpid(-1, os.WNOHANG)\n    alive.discard(pid)\n")
    spare = subprocess.Popen(["sleep", "3600"])
    bomb = subprocess.Popen(["sh", "-c", f'echo $$ > {group}/cgroup.procs && '
                             f'exec python3 -c "$0"', forker])
    try:
        (group / "cgroup.procs").write_text(str(spare.pid))
        for _ in range(100):  # until it has forked its sleepers
            if len((group / "cgroup.procs").read_text().split()) > 30:
                break
            time.sleep(0.05)
        assert end_processes(group, frozenset({spare.pid}))
        assert (group / "cgroup.procs").read_text().split() == [str(spare.pid)]
        assert bomb.wait(10) == -9
    finally:
        spare.kill()
        bomb.kill()
        spare.wait()
        bomb.wait()
        for _ in range(100):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.05)
