"""`rollout` as a job: seeded repeatability, the warm pool, a dead model server, SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from skyrl_agent.data.store import TrajectoryStore

pytestmark = pytest.mark.slow
CLI = [sys.executable, "-c", "from skyrl_agent.cli import main; main()"]
SMALL = ["--set", "agent.max_turns=2", "--set", "inference.max_tokens=24"]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=900)


def stored_keys(run_dir: Path) -> int:
    """Trajectories named in the run's index (readable while a writer appends)."""
    index = run_dir / "trajectories" / "index.jsonl"
    if not index.exists():
        return 0
    return sum(len(json.loads(line)["keys"]) for line in index.read_text().splitlines()
               if line.endswith("}"))


def wait_for_stored(process: subprocess.Popen, run_dir: Path, count: int,
                    timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while stored_keys(run_dir) < count:
        assert process.poll() is None, "the run ended before it could be interrupted"
        assert time.monotonic() < deadline, "nothing was stored in time"
        time.sleep(0.1)


def model_server_of(pid: int) -> int:
    """The embedded model server the process started (its other children are sandboxes)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            if b"skyrl_agent.inference.server" in Path(f"/proc/{child}/cmdline").read_bytes():
                return int(child)
    raise AssertionError("no model server child")


def token_ids(run_dir: Path) -> list[tuple[str, int, list[tuple[int, ...]]]]:
    trajectories = TrajectoryStore(run_dir).load().trajectories
    return [(t.task_id, t.sample_index,
             [turn.completion_ids for s in t.segments for turn in s.turns])
            for t in trajectories]


def test_the_same_seed_samples_the_same_tokens(tmp_path, smollm2_dir):
    """Two runs on the embedded server with one seed sample identical ids; another seed (the
    second sample's: each sample's seed comes from the run's, the task and its index) not."""
    def run(name: str) -> list:
        # CodeAct: its observations are command outputs, which do not depend on timing the way
        # a terminal screen captured after a wait does.
        result = cli("rollout", "--agent", "openhands", "--tasks", "demo", "--n", "2", "-j", "1",
                     "--output", str(tmp_path / name), "--set", "tasks.limit=1",
                     "--set", "seed=7", "--set", "agent.max_turns=2",
                     "--set", "inference.max_tokens=24")
        assert result.returncode == 0, result.stderr[-2000:]
        return sorted(token_ids(tmp_path / name))

    first, again = run("a"), run("b")
    assert first == again
    (_, zero, sampled_zero), (_, one, sampled_one) = first
    assert (zero, one) == (0, 1) and sampled_zero != sampled_one
    assert all(ids for _, _, ids in first)


def test_rollout_takes_sandboxes_from_the_warm_pool(tmp_path):
    result = cli("rollout", "--agent", "oracle", "--tasks", "demo", "--n", "3", "-j", "1",
                 "--set", 'tasks.include=["hello-file"]', "--set", "sandbox.warm_pool=2",
                 "--output", str(tmp_path / "run"))
    assert result.returncode == 0, result.stderr[-2000:]
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("warm pool:"))
    hits, started = (int(w) for w in line.split() if w.isdigit())
    assert started == 6 and hits >= 3, line  # per sample: the agent's, then the verifier's
    assert all(t.reward.value == 1.0 for t in TrajectoryStore(tmp_path / "run").load().trajectories)


@pytest.mark.serial
def test_a_killed_model_server_stops_the_run_in_seconds_and_it_resumes(tmp_path, smollm2_dir):
    run_dir = tmp_path / "run"
    command = [*CLI, "rollout", "--agent", "terminus", "--tasks", "demo", "--n", "2", "-j", "1",
               "--output", str(run_dir), "--set", "tasks.limit=2", *SMALL]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        wait_for_stored(process, run_dir, 1)
        server = model_server_of(process.pid)
        before = {(t.task_id, t.sample_index): t
                  for t in TrajectoryStore(run_dir).load().trajectories}
        os.kill(server, signal.SIGKILL)
        killed_at = time.monotonic()
        _, stderr = process.communicate(timeout=60)
        stopped_after = time.monotonic() - killed_at
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode not in (0, None)
    assert stopped_after < 15, f"took {stopped_after:.1f} s to notice the dead server"
    assert "Traceback" not in stderr and "model server exited" in stderr, stderr[-2000:]
    resumed = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    after = {(t.task_id, t.sample_index): t for t in TrajectoryStore(run_dir).load().trajectories}
    assert len(after) == 4
    assert all(after[key] == trajectory for key, trajectory in before.items())  # kept as is


def test_sigterm_stops_with_one_line_and_leaves_no_sandbox(tmp_path, work_root):
    run_dir = tmp_path / "run"
    process = subprocess.Popen(
        [*CLI, "rollout", "--agent", "oracle", "--tasks", "demo", "--n", "4", "-j", "2",
         "--output", str(run_dir), "--set", f"sandbox.work_root={work_root}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for_stored(process, run_dir, 2)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 143
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "SIGTERM" in lines[0], stderr[-2000:]
    stored = TrajectoryStore(run_dir).load().trajectories
    assert len(stored) >= 2 and all(t.reward.value == 1.0 for t in stored)  # real, not masked
    assert not any(work_root.iterdir())


def test_a_run_keeps_its_server_keys_in_one_private_file_only(tmp_path, tiny_model_dir):
    """Stops a key leak: the run's model server refuses control calls without its key, so the
    key lives in one mode-0600 file of the run dir, never in config.json, logs or metrics."""
    run_dir = tmp_path / "run"
    result = cli("rollout", "--agent", "openhands", "--tasks", "demo", "-j", "1",
                 "--output", str(run_dir), "--set", "tasks.limit=1",
                 "--set", f"inference.model={tiny_model_dir}", *SMALL)
    assert result.returncode == 0, result.stderr[-2000:]
    key_file = run_dir / "server-keys.json"
    assert key_file.stat().st_mode & 0o777 == 0o600
    (key,) = json.loads(key_file.read_text()).values()
    assert len(key) >= 32
    seen = [path for path in run_dir.rglob("*") if path.is_file() and path != key_file
            and key.encode() in path.read_bytes()]
    assert not seen and key not in result.stdout + result.stderr, seen
