"""The one lifecycle every command runs a task through (rollout, `tasks check`, re-grading).

    sandbox (pool or fresh) -> agent acts -> kill every process it left -> [[verifier.collect]]
    -> collect artifacts as a host-written bundle (kept as the final state) -> verify:
       separate: run the tests in a fresh sandbox with the bundle restored (started while
                 the agent works, so the hand-over does not wait for a start)
       shared:   run the tests in the agent's sandbox (its processes are dead; weaker)
    -> stop (in the background where the sandbox source does that)

Failures carry a FailureKind saying whose they are: the host's (a sandbox that will not start,
an engine error) or the agent's (its sandbox died under it, its artifacts pass the limits).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from skyrl_agent.atomic import atomic_write_bytes
from skyrl_agent.config import SandboxConfig, VerifierConfig
from skyrl_agent.envs.env import Env
from skyrl_agent.envs.verifier import (
    SEPARATE,
    SHARED,
    ArtifactPath,
    artifact_paths,
    collect_bundle,
    limits_of,
    restore_bundle,
    run_collect_hooks,
    run_tests,
    verifier_mode,
)
from skyrl_agent.sandboxes.artifacts import ArtifactLimitExceeded
from skyrl_agent.sandboxes.base import (
    Sandbox,
    SandboxDied,
    SandboxError,
    SandboxSpec,
    UnsupportedEnvironment,
)
from skyrl_agent.sandboxes.pool import SandboxPool
from skyrl_agent.tasks.spec import TaskSpec
from skyrl_agent.types import FailureKind, FinishReason, Reward


@dataclass(frozen=True)
class AgentOutcome:
    """How the agent's phase ended."""

    finish_reason: FinishReason
    failure: FailureKind | None = None
    """Set when the phase failed; decides masking and retry."""
    reason: str | None = None
    """Why it failed, in words."""
    metrics: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class EpisodeResult:
    """What one episode produced."""

    reward: Reward
    outcome: AgentOutcome
    sandbox_time_s: float = 0.0
    agent_time_s: float = 0.0
    mode: str = SEPARATE
    """`separate` or `shared`: where the tests ran."""
    exec_time_s: float = 0.0
    """Of the agent's time, seconds its commands ran in the sandbox (Env.exec_time_s)."""
    handover_time_s: float = 0.0
    """Killing the agent's processes; in separate mode also the wait for the verifier's
    sandbox and the restore (Trajectory.handover_time_s)."""
    stop_time_s: float = 0.0
    """Stopping the agent's sandbox."""
    total_time_s: float = 0.0
    """The whole episode, wall seconds (verification included)."""
    collect_time_s: float = 0.0
    """Collecting the agent's artifacts (Trajectory.collect_time_s)."""


@dataclass
class _Clock:
    """The episode's phase times as they are measured."""

    started: float = field(default_factory=time.monotonic)
    sandbox: float = 0.0
    agent: float = 0.0
    exec: float = 0.0
    handover: float = 0.0
    collect: float = 0.0
    stop: float = 0.0

    def result(self, reward: Reward, outcome: AgentOutcome, mode: str) -> EpisodeResult:
        return EpisodeResult(reward, outcome, self.sandbox, self.agent, mode, self.exec,
                             self.handover, self.stop, time.monotonic() - self.started,
                             collect_time_s=self.collect)


Act = Callable[[Env], Awaitable[AgentOutcome]]


class SandboxSource(Protocol):
    """Hands out started sandboxes and stops them after use (a SandboxPool, or
    fresh_sandboxes)."""

    config: SandboxConfig

    async def acquire(self, spec: SandboxSpec) -> Sandbox: ...

    async def acquire_spare(self, spec: SandboxSpec) -> Sandbox | None: ...

    async def release(self, sandbox: Sandbox) -> None: ...


def fresh_sandboxes(config: SandboxConfig, start_timeout_s: float = 900.0) -> SandboxPool:
    """A new sandbox per acquire, started within a deadline (a pool that keeps none)."""
    return SandboxPool(config, size=0, start_timeout_s=start_timeout_s)


SandboxFailure = SandboxError | UnsupportedEnvironment | ArtifactLimitExceeded


def failure_of(exc: SandboxFailure) -> FailureKind:
    """Whose failure a sandbox exception is: the agent's when its sandbox died or what it left
    passes the limits, the task's when the backend cannot run it, else the host's."""
    if isinstance(exc, SandboxDied):
        return FailureKind.SANDBOX_DIED
    if isinstance(exc, ArtifactLimitExceeded):
        return FailureKind.OVER_LIMIT
    if isinstance(exc, UnsupportedEnvironment):
        return FailureKind.UNSUPPORTED
    return FailureKind.INFRA


def _outcome(phase: str, exc: SandboxFailure) -> AgentOutcome:
    return AgentOutcome(FinishReason.SANDBOX_ERROR, failure_of(exc), f"{phase}: {exc}")


def _failed(phase: str, exc: SandboxFailure) -> tuple[Reward, AgentOutcome]:
    outcome = _outcome(phase, exc)
    return Reward.failed(outcome.reason or phase), outcome


async def run_episode(task: TaskSpec, act: Act, sandboxes: SandboxSource,
                      verifier: VerifierConfig, keep_state: Path | None = None) -> EpisodeResult:
    """Run `act` on the task and verify what it left; failures become a reward with a reason."""
    spec = SandboxSpec.from_task(task, sandboxes.config)
    mode = verifier_mode(task, verifier)
    paths = artifact_paths(task, spec.workdir)
    if not paths:
        mode = SHARED  # nothing to carry over: the tests must see the agent's sandbox
    clock = _Clock()
    try:
        sandbox = await sandboxes.acquire(spec)
    except (SandboxError, UnsupportedEnvironment) as exc:
        return clock.result(*_failed("sandbox start", exc), mode=mode)
    clock.sandbox = time.monotonic() - clock.started
    pending = _prestart_verifier(task, spec, sandboxes) if mode == SEPARATE else None
    saving: list[asyncio.Future[Path]] = []

    def keep(bundle: bytes) -> None:  # written while the tests run, on disk before we return
        if keep_state is not None:
            saving.append(asyncio.ensure_future(
                asyncio.to_thread(atomic_write_bytes, keep_state, bundle)))

    released = False

    async def release_agents() -> None:
        nonlocal released
        if not released:
            released, stopping = True, time.monotonic()
            await sandboxes.release(sandbox)
            clock.stop = time.monotonic() - stopping

    try:
        verdict, outcome = await _in_sandbox(task, act, sandbox, verifier, paths, mode, keep,
                                             clock)
        if isinstance(verdict, bytes):  # collected: the tests run in a fresh sandbox
            handing_over = time.monotonic()
            spare, pending = await _spare(pending), None
            if spare is None:  # none could be started ahead: ours stops first, as it did
                await release_agents()
            verdict, outcome = await _guarded(grade(task, verdict, sandboxes, spare), outcome)
            # All of grading but the tests is hand-over: the verifier's sandbox and the restore.
            grading_s = time.monotonic() - handing_over - clock.stop
            clock.handover += max(0.0, grading_s - verdict.verify_time_s)
    finally:
        # Its processes died at the hand-over; stopped now, its stop does not compete with it.
        await release_agents()
        if pending is not None:  # not graded: the agent failed, or the run was cancelled
            await asyncio.shield(_discard(pending, sandboxes))
        for save in saving:  # a failed write raises here, as it would have before the tests
            await asyncio.shield(save)
    return clock.result(verdict, outcome, mode)


def _prestart_verifier(task: TaskSpec, agent_spec: SandboxSpec,
                       sandboxes: SandboxSource) -> asyncio.Task[Sandbox | None]:
    """The verifier's sandbox, started while the agent works when a sandbox is spare (None
    when not). It waits at most as long as the agent's sandbox may live, so that wait is added
    to its deadline."""
    spec = SandboxSpec.from_task(verifier_task(task), sandboxes.config)
    waiting = dataclasses.replace(spec, deadline_s=spec.deadline_s + agent_spec.deadline_s)
    return asyncio.create_task(sandboxes.acquire_spare(waiting))


async def _spare(pending: asyncio.Task[Sandbox | None] | None) -> Sandbox | None:
    """The pre-started verifier's sandbox; None when there is none (not started, or its start
    failed: grading starts one the usual way, and says so if that fails too)."""
    if pending is None:
        return None
    try:
        return await pending
    except (SandboxError, UnsupportedEnvironment):
        return None


async def _discard(pending: asyncio.Task[Sandbox | None], sandboxes: SandboxSource) -> None:
    """Stop a pre-started sandbox that will not be used, started or still starting (a
    cancelled start stops what it made: SandboxPool._start)."""
    pending.cancel()
    started = (await asyncio.gather(pending, return_exceptions=True))[0]
    if isinstance(started, Sandbox):
        await sandboxes.release(started)


async def _in_sandbox(task: TaskSpec, act: Act, sandbox: Sandbox, verifier: VerifierConfig,
                      paths: tuple[ArtifactPath, ...], mode: str, keep: Callable[[bytes], None],
                      clock: _Clock) -> tuple[Reward | bytes, AgentOutcome]:
    """The agent's phase, the hand-over, and in shared mode the tests: the reward, or (separate
    mode) the collected bundle the verifier's sandbox gets; with the agent's outcome. The
    bundle goes to `keep` (the final state) as soon as it is collected."""
    agent_started = time.monotonic()
    env = Env(task, sandbox)
    outcome = await _act(act, env)
    clock.agent, clock.exec = time.monotonic() - agent_started, env.exec_time_s
    if outcome.failure in (FailureKind.INFRA, FailureKind.UNSUPPORTED, FailureKind.SANDBOX_DIED):
        return Reward.failed(outcome.reason or "failed"), outcome
    handing_over = time.monotonic()
    collected = await _collect(task, sandbox, verifier, paths, clock)
    if not isinstance(collected, tuple):
        keep(collected)
    clock.handover = max(0.0, time.monotonic() - handing_over - clock.collect)
    if isinstance(collected, tuple):
        return collected
    if mode == SEPARATE:
        return collected, outcome
    return await _guarded(run_tests(sandbox, task, fresh_home=True), outcome)


async def _act(act: Act, env: Env) -> AgentOutcome:
    try:
        return await act(env)
    except (SandboxError, UnsupportedEnvironment) as exc:
        return _outcome("under the agent", exc)


async def _collect(task: TaskSpec, sandbox: Sandbox, verifier: VerifierConfig,
                   paths: tuple[ArtifactPath, ...],
                   clock: _Clock) -> bytes | tuple[Reward, AgentOutcome]:
    """Kill the agent's processes and collect its artifacts: the bundle, or why not. The
    collection alone is timed (clock.collect), bounded by verifier.max_collect_seconds."""
    try:
        await sandbox.kill_processes()
        if await run_collect_hooks(sandbox, task):
            await sandbox.kill_processes()  # what the hooks started
        collecting = time.monotonic()
        try:
            return await collect_bundle(sandbox, paths, limits_of(verifier))
        finally:
            clock.collect = time.monotonic() - collecting
    except (SandboxError, ArtifactLimitExceeded) as exc:
        return _failed("collecting the artifacts", exc)


async def _guarded(verifying: Awaitable[Reward],
                   outcome: AgentOutcome) -> tuple[Reward, AgentOutcome]:
    """The reward, or the failure that kept the tests from running (whose it was)."""
    try:
        return await verifying, outcome
    except (SandboxError, UnsupportedEnvironment) as exc:  # e.g. its sandbox did not start
        return _failed("verifier", exc)


async def grade(task: TaskSpec, bundle: bytes, sandboxes: SandboxSource,
                started: Sandbox | None = None) -> Reward:
    """Separate-mode verification: a fresh sandbox from the pristine environment (the task's
    `[verifier.environment]` when it has one; `started` when one was started ahead), the
    bundle restored, the tests run. Re-grading a stored final state is this same call. Raises
    SandboxError when that sandbox cannot start (infrastructure); any later failure is reward
    0 with a reason."""
    spec = SandboxSpec.from_task(verifier_task(task), sandboxes.config)
    paths = artifact_paths(task, SandboxSpec.from_task(task, sandboxes.config).workdir)
    try:
        sandbox = started or await sandboxes.acquire(spec)
    except SandboxError as exc:  # raised on: retrying may help, the agent did nothing wrong
        raise SandboxError(f"the verifier's sandbox did not start: {exc}") from None
    try:
        await restore_bundle(sandbox, bundle, paths)
        reward = await run_tests(sandbox, task, fresh_home=False)
    except SandboxError as exc:
        reward = Reward.failed(f"sandbox error during verification: {exc}")
    finally:
        await sandboxes.release(sandbox)
    return reward


def verifier_task(task: TaskSpec) -> TaskSpec:
    """The task with `[verifier.environment]` as its environment, when it defines one."""
    environment = task.config.verifier.environment
    if environment is None:
        return task
    config = task.config.model_copy(update={"environment": environment})
    return dataclasses.replace(task, config=config)

