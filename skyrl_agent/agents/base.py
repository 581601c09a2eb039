"""The Agent protocol: act in an Env, talk to the model only through an LLM session."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from skyrl_agent import plugins
from skyrl_agent.envs.env import Env


class Agent(ABC):
    """One attempt at one task. Registered under the entry-point group `skyrl_agent.agents`."""

    name: ClassVar[str]
    """The registered name."""
    needs_model: ClassVar[bool] = True
    """False for agents that never call the model (oracle, nop): no server is started for them."""

    @abstractmethod
    async def run(self, env: Env, llm: Any | None) -> None:
        """Work on env's task until done; the caller verifies afterwards."""


def agent_class(name: str) -> type[Agent]:
    """The Agent class registered as `name`; an unknown name lists the available agents."""
    return plugins.load(plugins.AGENTS, name)
