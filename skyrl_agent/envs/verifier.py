"""Harbor's reward protocol, run after the agent stops.

Stale reward files are deleted, tests/ is copied to /tests (only now, so the agent never saw it),
test.sh runs with the verifier's timeout, user and env, and reward.json (wins) or reward.txt is
read. Whatever goes wrong becomes reward 0 with the reason recorded, never an exception.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from pathlib import Path

from skyrl_agent.sandboxes.base import Sandbox, SandboxError
from skyrl_agent.tasks.model import TaskSpec
from skyrl_agent.types import Reward

VERIFIER_DIR = "/logs/verifier"


def parse_reward_json(text: str) -> tuple[float, dict[str, float]]:
    """(value, components) from reward.json; raises ValueError for anything but finite numbers."""
    data = json.loads(text)
    if not isinstance(data, dict) or not data:
        raise ValueError("reward.json must be a non-empty object of numbers")
    components: dict[str, float] = {}
    for key, value in data.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"reward.json key {key!r} is not a number")
        if not math.isfinite(value):
            raise ValueError(f"reward.json key {key!r} is {value}")
        components[key] = float(value)
    if "reward" in components:
        return components["reward"], components
    return sum(components.values()) / len(components), components


def parse_reward_txt(text: str) -> float:
    value = float(text.strip())
    if not math.isfinite(value):
        raise ValueError(f"reward.txt holds {value}")
    return value


async def _read(sandbox: Sandbox, remote: str, scratch: Path) -> str | None:
    local = scratch / Path(remote).name
    try:
        await sandbox.download(remote, local)
    except FileNotFoundError:
        return None
    return local.read_text(errors="replace")


async def verify(sandbox: Sandbox, task: TaskSpec) -> Reward:
    """Run the task's tests in the sandbox and return the reward (0 with a reason on failure)."""
    started = time.monotonic()
    try:
        return await _verify(sandbox, task, started)
    except SandboxError as exc:
        return Reward.failed(f"sandbox error during verification: {exc}",
                             time.monotonic() - started)
    except Exception as exc:  # noqa: BLE001 - a verifier failure must cost a reward, not a run
        return Reward.failed(f"verifier error: {type(exc).__name__}: {exc}",
                             time.monotonic() - started)


async def _verify(sandbox: Sandbox, task: TaskSpec, started: float) -> Reward:
    verifier = task.config.verifier
    prepared = await sandbox.exec(
        f"rm -rf /tests {VERIFIER_DIR}/reward.txt {VERIFIER_DIR}/reward.json && "
        f"mkdir -p {VERIFIER_DIR}", timeout=60)
    if not prepared.ok:
        return Reward.failed(f"could not prepare verification: {prepared.stderr.strip()[-200:]}")
    await sandbox.upload(task.tests_dir, "/tests")
    run = await sandbox.exec(
        f"bash /tests/test.sh > {VERIFIER_DIR}/test-stdout.txt 2>&1",
        timeout=verifier.timeout_sec, env=dict(verifier.env), user=verifier.user)
    elapsed = lambda: time.monotonic() - started  # noqa: E731
    if run.timed_out:
        return Reward.failed(f"verifier timed out after {verifier.timeout_sec:g}s", elapsed())
    with tempfile.TemporaryDirectory() as scratch:
        reward_json = await _read(sandbox, f"{VERIFIER_DIR}/reward.json", Path(scratch))
        reward_txt = None if reward_json is not None else await _read(
            sandbox, f"{VERIFIER_DIR}/reward.txt", Path(scratch))
    try:
        if reward_json is not None:
            value, components = parse_reward_json(reward_json)
        elif reward_txt is not None:
            value = parse_reward_txt(reward_txt)
            components = {"reward": value}
        else:
            return Reward.failed(f"no reward file (test.sh exited {run.exit_code})", elapsed())
    except (ValueError, json.JSONDecodeError) as exc:
        name = "reward.json" if reward_json is not None else "reward.txt"
        return Reward.failed(f"unreadable {name}: {exc}", elapsed())
    return Reward(value=value, components=components, verify_time_s=elapsed())
