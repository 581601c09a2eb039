"""`answer`: one model call, its reply written to a file the task's tests read.

For single-turn tasks (questions with a checkable answer, toy tasks that show a trainer learns):
the instruction is the user message, and the reply's text goes to `/app/answer.txt` verbatim.
No tools, no terminal: the model's only action is its reply.
"""

from __future__ import annotations

from skyrl_agent.agents.base import ModelAgent, task_content
from skyrl_agent.envs.env import Env
from skyrl_agent.llm.session import LLMSession
from skyrl_agent.types import FinishReason

ANSWER_FILE = "/app/answer.txt"


class AnswerAgent(ModelAgent):
    """Asks the model once and writes its reply to /app/answer.txt."""

    name = "answer"

    async def act(self, env: Env, llm: LLMSession) -> FinishReason:
        reply = await llm.chat([{"role": "user",
                                 "content": task_content(env, llm, "{instruction}")}])
        await env.write_file(ANSWER_FILE, reply.text)
        self.count("answer_chars", len(reply.text))
        return FinishReason.STOP
