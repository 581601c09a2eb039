"""An example plug-in agent: asks the model for a greeting, then writes the one the task wants.

Install it (`pip install ./examples/hello-agent`) and it shows up in `skyrl-agent agents list`
and runs with `skyrl-agent rollout --agent hello`.
"""

from __future__ import annotations

from skyrl_agent.agents.base import Agent, AgentResult
from skyrl_agent.llm.session import LLMSession
from skyrl_agent.envs.env import Env
from skyrl_agent.types import FinishReason


class HelloAgent(Agent):
    """Greets the model once, then writes /app/greeting.txt."""

    name = "hello"

    async def run(self, env: Env, llm: LLMSession | None) -> AgentResult:
        assert llm is not None
        reply = await llm.chat([
            {"role": "system", "content": "You are friendly."},
            {"role": "user", "content": "Say hello in three words."}])
        await env.write_file("/app/greeting.txt", "Hello from the terminal!\n")
        return AgentResult(FinishReason.STOP, {"reply_chars": len(reply.text)})
