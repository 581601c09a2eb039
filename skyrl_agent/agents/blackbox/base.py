"""Black-box agents: agent programs we did not write, run inside our episode lifecycle.

The program runs on the host (in this process, or in a thread when it is synchronous). Its
model calls go to a capture proxy on 127.0.0.1 under a key of its own, so every call is
recorded token-exactly in the episode's LLM session; its commands go to the episode's sandbox
through `env`. The episode keeps its deadlines, process kill and separate verification, so the
agent framework is trusted no more than our own agents: what the model writes, and anything
that comes back from the sandbox, stays adversarial.
"""

from __future__ import annotations

import asyncio
import importlib.util
from abc import abstractmethod
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from skyrl_agent.agents.base import Agent, AgentResult
from skyrl_agent.capture import CaptureHandle, CaptureProxy
from skyrl_agent.envs.env import Env
from skyrl_agent.errors import UserError
from skyrl_agent.sandboxes.base import ExecResult
from skyrl_agent.types import FinishReason

if TYPE_CHECKING:
    from skyrl_agent.llm.session import LLMSession

EXTRA = "agents"
"""The pip extra that installs the black-box agents' packages."""
MODEL_NAME = "skyrl-agent"
"""The model name external agents are configured with (the proxy serves any name)."""


class AgentStopped(RuntimeError):
    """The episode ended (deadline, cancellation) while the external agent still ran."""


def require(module: str, agent: str, install: str | None = None) -> None:
    """One clear line naming the extra (or `install`, how to get the package) when an agent's
    package is not installed (called when the agent's module is loaded, so a run fails before
    anything starts)."""
    top = module.split(".")[0]
    try:
        found = importlib.util.find_spec(top) is not None
    except ValueError:  # in sys.modules as None: blocked
        found = False
    if not found:
        # No brackets in the words: the CLI prints errors as rich markup.
        how = install or f"it comes with the `{EXTRA}` extra of skyrl-agent"
        raise UserError(f"the {agent} agent needs the {top} package, which is not installed; "
                        f"{how}")


class BlackBoxAgent(Agent):
    """An external agent against a capture proxy; subclasses implement `drive`."""

    def __init__(self, max_turns: int = 50) -> None:
        super().__init__(max_turns)
        self.counts: dict[str, float] = {}

    async def run(self, env: Env, llm: LLMSession | None) -> AgentResult:
        if llm is None:
            raise ValueError(f"agent {self.name!r} needs a model session")
        self.counts = {}
        async with CaptureProxy(model_name=MODEL_NAME) as proxy:
            handle = proxy.open(llm)
            try:
                finish = await self.drive(env, handle)
            except Exception as exc:  # noqa: BLE001 - sorted out in _failed, re-raised there
                finish = self._failed(handle, exc)
            finally:
                proxy.close(handle)  # a thread still running gets 401s from now on
        stats = handle.session.stats
        if handle.session.server_error is not None:
            raise handle.session.server_error
        if stats.budget_spent:
            finish = FinishReason.TOKEN_BUDGET
        return AgentResult(finish, {**handle.session.metrics(), **self.counts})

    def _failed(self, handle: CaptureHandle, exc: Exception) -> FinishReason:
        """Why an external agent that raised ended, when the proxy's refusals explain it."""
        session = handle.session
        if session.server_error is not None:
            raise session.server_error
        if session.stats.budget_spent:
            return FinishReason.TOKEN_BUDGET
        if session.stats.context_overflows:
            return FinishReason.CONTEXT_OVERFLOW
        raise exc  # the agent's own crash

    def count(self, key: str, amount: float = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + amount

    @abstractmethod
    async def drive(self, env: Env, handle: CaptureHandle) -> FinishReason:
        """Run the external agent on env's task with its model at `handle.base_url`."""


class SandboxBridge:
    """Synchronous access to the episode's sandbox for an agent running in a worker thread."""

    def __init__(self, env: Env, loop: asyncio.AbstractEventLoop) -> None:
        self.env = env
        self.loop = loop
        self.stopped = False

    def exec(self, command: str, timeout: float, cwd: str | None = None,
             variables: Mapping[str, str] | None = None) -> ExecResult:
        if self.stopped:
            raise AgentStopped("the episode is over")
        future = asyncio.run_coroutine_threadsafe(
            self.env.exec(command, timeout=timeout, cwd=cwd, env=variables), self.loop)
        return future.result(timeout=timeout + 60)  # the sandbox enforces `timeout` itself

    async def run[T](self, work: Callable[[], T]) -> T:
        """Run `work` in a thread; once this returns or is cancelled, sandbox calls refuse."""
        try:
            return await asyncio.to_thread(work)
        finally:
            self.stopped = True
