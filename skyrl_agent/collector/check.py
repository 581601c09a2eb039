"""`tasks check`: run a model-free agent (oracle, nop) on tasks and report each reward.

The quickest proof that a task set, a sandbox backend and the verifier agree with each other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from skyrl_agent.agents.base import Agent, agent_class, run_agent
from skyrl_agent.config import SandboxConfig, VerifierConfig
from skyrl_agent.envs.env import Env
from skyrl_agent.envs.episode import AgentOutcome, run_episode
from skyrl_agent.errors import UserError
from skyrl_agent.sandboxes.pool import SandboxPool
from skyrl_agent.tasks.spec import TaskSpec


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


async def check_task(task: TaskSpec, agent: str | Agent, pool: SandboxPool,
                     verifier: VerifierConfig | None = None) -> CheckResult:
    """One episode of a model-free agent (a registered name, or an instance); failures
    become a reason, not an exception."""
    if isinstance(agent, str):
        agent = agent_class(agent)()
    if getattr(agent, "needs_model", True):
        raise UserError(f"agent {agent.name!r} needs a model; `tasks check` runs oracle or nop")

    async def act(env: Env) -> AgentOutcome:
        return await run_agent(agent, env, None, task.agent_timeout_s)

    episode = await run_episode(task, act, pool, verifier or VerifierConfig())
    reward = episode.reward
    return CheckResult(task.name, reward.value, dict(reward.components),
                       reward.reason or episode.outcome.reason, episode.sandbox_time_s,
                       episode.agent_time_s, reward.verify_time_s)


async def check_tasks(tasks: list[TaskSpec], agent_name: str, config: SandboxConfig,
                      jobs: int = 1, verifier: VerifierConfig | None = None,
                      on_result: Callable[[CheckResult], None] | None = None,
                      ) -> list[CheckResult]:
    """Check tasks with at most `jobs` at once; results come back in the tasks' order."""
    agent_class(agent_name)  # an unknown agent fails before any sandbox starts
    pool = SandboxPool(config, size=config.warm_pool, stop_in_background=True)
    limit = asyncio.Semaphore(jobs)

    async def one(task: TaskSpec) -> CheckResult:
        async with limit:
            result = await check_task(task, agent_name, pool, verifier)
        if on_result is not None:
            on_result(result)
        return result

    try:
        return list(await asyncio.gather(*(one(t) for t in tasks)))
    finally:
        await asyncio.shield(pool.close())
