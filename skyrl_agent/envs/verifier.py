"""Harbor's reward protocol, run so that the agent cannot reach it.

The agent is root in its sandbox and adversarial. After it stops, every process it left is
killed and its artifacts (task.toml `artifacts`, or the working directory) are collected as a
host-written bundle (sandboxes/artifacts.py). Then, in `separate` mode (the default here), the
tests run in a fresh sandbox built from the pristine environment, with the bundle restored at
its paths; in `shared` mode (Harbor's default, weaker) they run in the agent's sandbox. Either
way: tests/ is copied in only now, test.sh runs from /tests with the sandbox's own environment
plus the verifier's `env`, every process is killed once it ends, and the reward file is read by
the host without following links. Whatever goes wrong becomes reward 0 with a reason.
"""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import math
import posixpath
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from harbor.models.task.config import ArtifactConfig, VerifierEnvironmentMode

from skyrl_agent.config import VerifierConfig
from skyrl_agent.sandboxes.archive import one_file_tar
from skyrl_agent.sandboxes.artifacts import ArtifactLimitExceeded, ArtifactLimits, BundleWriter
from skyrl_agent.sandboxes.base import Sandbox, SandboxError
from skyrl_agent.tasks.spec import CHALLENGE_FILE, Challenger, LogGrader, TaskSpec
from skyrl_agent.types import Reward

VERIFIER_DIR = "/logs/verifier"
REWARD_FILE_LIMIT = 64 * 1024
TEST_LOG_LIMIT = 32 * 1024 * 1024
SEPARATE, SHARED = "separate", "shared"


@dataclass(frozen=True)
class ArtifactPath:
    """One absolute sandbox path collected after the agent stops."""

    path: str
    exclude: tuple[str, ...] = ()
    """harbor `exclude` patterns (matched against names and base names)."""


def verifier_mode(task: TaskSpec, config: VerifierConfig) -> str:
    """`separate` or `shared`: the task's explicit choice, else separate when it defines a
    verifier environment, else the run's default."""
    verifier = task.config.verifier
    if verifier.environment_mode is not None:
        return SEPARATE if verifier.environment_mode == VerifierEnvironmentMode.SEPARATE else SHARED
    if verifier.environment is not None:
        return SEPARATE
    return config.default_mode


def artifact_paths(task: TaskSpec, workdir: str) -> tuple[ArtifactPath, ...]:
    """The task's declared artifacts (relative ones under the workdir), else the workdir."""
    paths = []
    for entry in task.config.artifacts:
        item = entry if isinstance(entry, ArtifactConfig) else ArtifactConfig(source=entry)
        if item.service not in (None, "main"):
            continue  # sidecar services are not supported by our backends
        source = posixpath.normpath(posixpath.join(workdir, item.source))
        paths.append(ArtifactPath(source, tuple(item.exclude)))
    if not paths and workdir not in ("", "/"):
        paths.append(ArtifactPath(workdir))
    return tuple(paths)


def limits_of(config: VerifierConfig) -> ArtifactLimits:
    return ArtifactLimits(max_bytes=config.max_artifact_mb * 1024 * 1024,
                          max_entries=config.max_artifact_files,
                          max_seconds=config.max_collect_seconds)


async def run_collect_hooks(sandbox: Sandbox, task: TaskSpec) -> bool:
    """`[[verifier.collect]]` commands of the main service, run before collection; whether any
    ran (what they started must be killed too)."""
    hooks = [hook for hook in task.config.verifier.collect if hook.service == "main"]
    for hook in hooks:
        await sandbox.exec(hook.command, timeout=hook.timeout_sec, user=hook.user)
    return bool(hooks)


async def collect_bundle(sandbox: Sandbox, paths: tuple[ArtifactPath, ...],
                         limits: ArtifactLimits) -> bytes:
    """The artifacts as a gzipped tar the host wrote; ArtifactLimitExceeded past `limits`."""
    buffer = io.BytesIO()
    with BundleWriter(buffer, limits) as writer:
        for artifact in paths:
            writer.exclude = artifact.exclude
            await sandbox.collect(artifact.path, writer)
    return buffer.getvalue()


async def restore_bundle(sandbox: Sandbox, bundle: bytes,
                         paths: tuple[ArtifactPath, ...]) -> None:
    """Replace each artifact path of a fresh sandbox with the bundle's content (a path the
    agent deleted stays deleted)."""
    # Our own archive; the sandbox's tar reads it plain (tar cannot sniff gzip on a pipe).
    await sandbox.extract_replacing(gzip.decompress(bundle), "/", [a.path for a in paths])


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


async def run_tests(sandbox: Sandbox, task: TaskSpec, fresh_home: bool) -> Reward:
    """Copy tests/ in, run test.sh, kill what it left, read the reward (0 with a reason on any
    failure, never an exception)."""
    started = time.monotonic()
    try:
        return await _run_tests(sandbox, task, fresh_home, started)
    except SandboxError as exc:
        return Reward.failed(f"sandbox error during verification: {exc}",
                             time.monotonic() - started)
    except ArtifactLimitExceeded as exc:
        return Reward.failed(f"reward file: {exc}", time.monotonic() - started)


async def _run_tests(sandbox: Sandbox, task: TaskSpec, fresh_home: bool,
                     started: float) -> Reward:
    verifier = task.config.verifier
    other_user = verifier.user not in (None, 0, "0", "root")
    # A test.sh run as another user gets a HOME of its own and must be able to write its
    # reward; where that user cannot exist (a local sandbox) the exec below says so.
    home = "$(mktemp -d /tmp/verifier-home.XXXXXX)" if fresh_home or other_user else "$HOME"
    give = (f" && {{ chown {shlex.quote(str(verifier.user))} {VERIFIER_DIR} \"$home\" "
            "2>/dev/null || true; }" if other_user else "")
    prepared = await sandbox.exec(
        f"if [ -L /logs ]; then rm -f /logs; fi; rm -rf /tests {VERIFIER_DIR} && "
        f"mkdir -p {VERIFIER_DIR} && home={home}{give} && echo \"$home\"",
        timeout=60, cwd="/", user=0)
    if not prepared.ok:
        return Reward.failed(f"could not prepare verification: {prepared.stderr.strip()[-200:]}")
    await sandbox.upload_task_folder(task.task_dir, "tests", "/tests")
    challenge = task.grader.challenge() if task.grader is not None else None
    if challenge is not None:  # the tests/ of this verification only, never the task folder
        await sandbox.extract(one_file_tar(posixpath.basename(CHALLENGE_FILE),
                                           challenge.to_json().encode()),
                              posixpath.dirname(CHALLENGE_FILE))
    env = {**verifier.env, "HOME": prepared.stdout.strip()}
    run = await sandbox.exec(
        f"bash /tests/test.sh > {VERIFIER_DIR}/test-stdout.txt 2>&1",
        timeout=verifier.timeout_sec, cwd="/tests", env=env, user=verifier.user)
    await sandbox.kill_processes()  # nothing test.sh started may write the reward after it
    elapsed = lambda: time.monotonic() - started  # noqa: E731
    if run.timed_out:
        return Reward.failed(f"verifier timed out after {verifier.timeout_sec:g}s", elapsed())
    if task.grader is not None:
        return await _graded_from_log(sandbox, task.grader, challenge, elapsed)
    reward_json = await sandbox.read_file(f"{VERIFIER_DIR}/reward.json", REWARD_FILE_LIMIT)
    reward_txt = None if reward_json is not None else await sandbox.read_file(
        f"{VERIFIER_DIR}/reward.txt", REWARD_FILE_LIMIT)
    try:
        if reward_json is not None:
            value, components = parse_reward_json(reward_json.decode(errors="replace"))
        elif reward_txt is not None:
            value = parse_reward_txt(reward_txt.decode(errors="replace"))
            components = {"reward": value}
        else:
            return Reward.failed(f"no reward file (test.sh exited {run.exit_code})", elapsed())
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        name = "reward.json" if reward_json is not None else "reward.txt"
        return Reward.failed(f"unreadable {name}: {exc}", elapsed())
    return Reward(value=value, components=components, verify_time_s=elapsed())


async def _graded_from_log(sandbox: Sandbox, grader: LogGrader, challenge: Challenger | None,
                           elapsed: Callable[[], float]) -> Reward:
    """The task's own grader over test.sh's output and its test command's, read by the host
    once every process of the run is dead; reward files in the sandbox are ignored."""
    try:
        script_log = await sandbox.read_file(f"{VERIFIER_DIR}/test-stdout.txt", TEST_LOG_LIMIT)
        test_output = await sandbox.read_file(grader.test_output, TEST_LOG_LIMIT)
    except ArtifactLimitExceeded:
        return Reward.failed(f"test output over {TEST_LOG_LIMIT // (1024 * 1024)} MB", elapsed())
    if script_log is None:
        return Reward.failed("no output from test.sh", elapsed())
    texts = (script_log.decode(errors="replace"),
             None if test_output is None else test_output.decode(errors="replace"))
    try:
        reward = await asyncio.to_thread(grader.grade, *texts, challenge)
    except Exception as exc:  # noqa: BLE001 - a grader's defect must not end the run
        return Reward.failed(f"grading the test output failed: {exc}", elapsed())
    return replace(reward, verify_time_s=elapsed())
