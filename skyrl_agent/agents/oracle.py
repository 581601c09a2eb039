"""Agents that need no model: `oracle` runs the task's reference solution, `nop` does nothing.

They prove a task set is sound: oracle must score 1 and nop 0 on every task.
"""

from __future__ import annotations

from typing import Any

from skyrl_agent.agents.base import Agent
from skyrl_agent.envs.env import Env


class AgentFailed(Exception):
    """The agent could not do its work (recorded as the trajectory's reason)."""


class OracleAgent(Agent):
    """Copies solution/ to /solution and runs solve.sh in the task's working directory."""

    name = "oracle"
    needs_model = False

    async def run(self, env: Env, llm: Any | None) -> None:
        if not (env.task.solution_dir / "solve.sh").is_file():
            raise AgentFailed(f"task {env.task.name} has no solution/solve.sh")
        await env.upload_task_folder("solution", "/solution")
        result = await env.exec("bash /solution/solve.sh", timeout=env.task.agent_timeout_s,
                                env=dict(env.task.config.solution.env))
        if result.timed_out:
            raise AgentFailed(f"solve.sh timed out after {env.task.agent_timeout_s:g}s")


class NopAgent(Agent):
    """Does nothing: the starting state must not pass the tests."""

    name = "nop"
    needs_model = False

    async def run(self, env: Env, llm: Any | None) -> None:
        return None
