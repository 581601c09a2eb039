"""The Agent protocol: act in an Env, talk to the model only through an LLM session."""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from skyrl_agent import plugins
from skyrl_agent.envs.env import Env
from skyrl_agent.envs.episode import AgentOutcome
from skyrl_agent.inference.client import InferenceError
from skyrl_agent.sandboxes.base import SandboxError
from skyrl_agent.types import FailureKind, FinishReason

if TYPE_CHECKING:
    from skyrl_agent.llm.session import LLMSession
    from skyrl_agent.tasks.families.base import Step


@dataclass(frozen=True)
class AgentResult:
    """How an agent's run ended, as the agent saw it (the verifier decides the reward)."""

    finish_reason: FinishReason = FinishReason.STOP
    """stop (the agent declared it was done), max_turns, context_overflow, ..."""
    metrics: Mapping[str, float] = field(default_factory=dict)
    """Agent-specific counts (parse errors, commands run, tool calls, ...)."""


class Agent(ABC):
    """One attempt at one task. Registered under the entry-point group `skyrl_agent.agents`."""

    name: ClassVar[str]
    """The registered name."""
    needs_model: ClassVar[bool] = True
    """False for agents that never call the model (oracle, nop): no server is started for them."""
    tools: ClassVar[list[dict[str, Any]] | None] = None
    """Tool schemas (OpenAI function format) passed to the chat template, if the agent has any."""
    vision_tools: ClassVar[list[dict[str, Any]]] = []
    """Further tools offered only when the model sees images (e.g. looking at an image file)."""

    def tools_for(self, sees_images: bool) -> list[dict[str, Any]] | None:
        """The tools the chat template gets, for a model that sees images or not."""
        if sees_images and self.vision_tools:
            return [*(self.tools or []), *self.vision_tools]
        return self.tools

    def __init__(self, max_turns: int = 50) -> None:
        self.max_turns = max_turns

    @abstractmethod
    async def run(self, env: Env, llm: LLMSession | None) -> AgentResult | None:
        """Work on env's task until done; the caller verifies afterwards. None means STOP."""

    @classmethod
    def demonstration(cls, commands: Sequence[str], plan: str) -> list[str]:
        """The replies this agent's model would give to run `commands` (a task's reference
        solution) and finish, in the agent's own format: what `skyrl-agent demos` records.
        Agents that cannot act out shell commands raise NotImplementedError."""
        raise NotImplementedError(f"agent {cls.name!r} cannot act out a solution's commands")

    @classmethod
    def walkthrough(cls, steps: Sequence[Step], plan: str) -> list[str]:
        """The replies that act out a multi-turn walkthrough: one per step, each saying what
        the step before it showed (`Step.finding`), the last declaring the task done; then
        whatever the agent needs to finish. Agents that cannot raise NotImplementedError."""
        raise NotImplementedError(f"agent {cls.name!r} cannot act out a walkthrough")


log = logging.getLogger(__name__)
_INSTRUCTION = "\x00instruction\x00"


def task_content(env: Env, llm: LLMSession, template: str,
                 **fields: str) -> str | list[dict[str, Any]]:
    """The content of the message that gives the task: `template` formatted with the
    instruction and `fields`. For a model that sees images, the images the instruction links
    are shown where the links are (content parts); otherwise, and when there are none, it is
    the plain text."""
    parts = env.instruction_parts() if llm.sees_images else [env.instruction.strip()]
    if all(isinstance(part, str) for part in parts):
        return template.format(instruction=env.instruction.strip(), **fields)
    before, after = template.format(instruction=_INSTRUCTION, **fields).split(_INSTRUCTION)
    content: list[dict[str, Any]] = []
    for part in [before, *parts, after]:
        if isinstance(part, bytes):
            content.append({"type": "image", "data": part})
        elif part:
            content.append({"type": "text", "text": part})
    return content


async def run_agent(agent: Agent, env: Env, llm: LLMSession | None,
                    timeout_s: float) -> AgentOutcome:
    """Run an agent to its end or deadline. Its own failures become an outcome; sandbox errors
    propagate, for the episode to attribute."""
    try:
        result = await asyncio.wait_for(agent.run(env, llm), timeout=timeout_s)
    except TimeoutError:
        return AgentOutcome(FinishReason.AGENT_TIMEOUT, FailureKind.AGENT_TIMEOUT,
                            f"agent timed out after {timeout_s:g} s")
    except SandboxError:
        raise
    except InferenceError as exc:
        return AgentOutcome(FinishReason.ERROR, FailureKind.INFRA, f"model server: {exc}")
    except Exception as exc:
        log.warning("agent %s crashed on %s", agent.name, env.task.name, exc_info=True)
        return AgentOutcome(FinishReason.ERROR, FailureKind.AGENT_CRASH,
                            f"agent crashed: {type(exc).__name__}: {exc}")
    result = result or AgentResult()
    return AgentOutcome(result.finish_reason, metrics=dict(result.metrics))


def agent_class(name: str) -> type[Agent]:
    """The Agent class registered as `name`; an unknown name lists the available agents."""
    return plugins.load(plugins.AGENTS, name)


class ModelAgent(Agent):
    """An agent that loops model reply -> action -> observation until done or out of turns.

    Subclasses implement `act`; this class turns a context overflow into a finish reason and
    collects the counts subclasses add to `self.counts`.
    """

    async def run(self, env: Env, llm: LLMSession | None) -> AgentResult:
        from skyrl_agent.llm.session import ContextOverflow, TokenBudgetSpent

        if llm is None:
            raise ValueError(f"agent {self.name!r} needs a model session")
        self.counts: dict[str, float] = {}
        try:
            finish = await self.act(env, llm)
        except ContextOverflow:
            finish = FinishReason.CONTEXT_OVERFLOW
        except TokenBudgetSpent:
            finish = FinishReason.TOKEN_BUDGET
        return AgentResult(finish, dict(self.counts))

    def count(self, key: str, amount: float = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + amount

    @abstractmethod
    async def act(self, env: Env, llm: LLMSession) -> FinishReason:
        """The agent's loop; returns why it ended."""


def clip(text: str, limit: int) -> str:
    """Keep the head and tail of a long observation, saying how much was cut."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"
