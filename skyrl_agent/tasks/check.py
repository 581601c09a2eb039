"""`tasks check`: run a model-free agent (oracle, nop) on tasks and report each reward.

The quickest proof that a task set, a sandbox backend and the verifier agree with each other.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from skyrl_agent.agents.base import agent_class
from skyrl_agent.agents.oracle import AgentFailed
from skyrl_agent.config import SandboxConfig
from skyrl_agent.envs.env import Env
from skyrl_agent.errors import UserError
from skyrl_agent.sandboxes.base import SandboxError, SandboxSpec, UnsupportedEnvironment
from skyrl_agent.sandboxes.pool import SandboxPool
from skyrl_agent.tasks.model import TaskSpec


@dataclass(frozen=True)
class CheckResult:
    """One task's outcome under a model-free agent."""

    task: str
    reward: float
    components: dict[str, float] = field(default_factory=dict)
    reason: str | None = None
    """Why the reward is not what the tests said (sandbox error, timeout, no reward file, ...)."""
    sandbox_time_s: float = 0.0
    agent_time_s: float = 0.0
    verify_time_s: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)


async def _run_agent(agent_name: str, env: Env) -> str | None:
    agent = agent_class(agent_name)()
    if getattr(agent, "needs_model", True):
        raise UserError(f"agent {agent_name!r} needs a model; `tasks check` runs oracle or nop")
    try:
        await asyncio.wait_for(agent.run(env, None), timeout=env.task.agent_timeout_s)
    except TimeoutError:
        return f"agent timed out after {env.task.agent_timeout_s:g}s"
    except (AgentFailed, SandboxError) as exc:
        return f"agent failed: {exc}"
    return None


async def check_task(task: TaskSpec, agent_name: str, pool: SandboxPool) -> CheckResult:
    """Start a sandbox, run the agent, verify, stop; failures become a reason, not an exception."""
    spec = SandboxSpec.from_task(task, pool.config)
    started = time.monotonic()
    try:
        sandbox = await pool.acquire(spec)
    except (SandboxError, UnsupportedEnvironment) as exc:
        return CheckResult(task.name, 0.0, reason=f"sandbox: {exc}")
    sandbox_time = time.monotonic() - started
    try:
        env = Env(task, sandbox)
        agent_started = time.monotonic()
        agent_reason = await _run_agent(agent_name, env)
        agent_time = time.monotonic() - agent_started
        reward = await env.verify()
    finally:
        await sandbox.stop()
    return CheckResult(task.name, reward.value, dict(reward.components),
                       reward.reason or agent_reason, sandbox_time, agent_time,
                       reward.verify_time_s)


async def check_tasks(tasks: list[TaskSpec], agent_name: str, config: SandboxConfig,
                      jobs: int = 1,
                      on_result: Callable[[CheckResult], None] | None = None,
                      ) -> list[CheckResult]:
    """Check tasks with at most `jobs` at once; results come back in the tasks' order."""
    agent_class(agent_name)  # an unknown agent fails before any sandbox starts
    pool = SandboxPool(config, size=config.warm_pool)
    limit = asyncio.Semaphore(jobs)

    async def one(task: TaskSpec) -> CheckResult:
        async with limit:
            result = await check_task(task, agent_name, pool)
        if on_result is not None:
            on_result(result)
        return result

    try:
        return list(await asyncio.gather(*(one(t) for t in tasks)))
    finally:
        await pool.close()
