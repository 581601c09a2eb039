"""Harbor's own terminus-2 (from the `harbor` package, via litellm) against the capture proxy,
its tmux session in the episode's sandbox.

Terminus-2 compacts its history itself when the context fills (a summary, questions and
answers by three sub-calls, then a restart from a handoff prompt); through the proxy each of
those rewrites becomes a new segment instead of a drifted single sequence.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from skyrl_agent.agents.blackbox.base import MODEL_NAME, BlackBoxAgent, require
from skyrl_agent.capture import CaptureHandle
from skyrl_agent.envs.env import Env
from skyrl_agent.types import FinishReason

require("harbor.agents.terminus_2", "terminus-2")


class HarborTerminus2Agent(BlackBoxAgent):
    """Harbor's terminus-2 (package harbor) through the capture proxy."""

    name = "terminus-2"

    def __init__(self, max_turns: int = 50, summarize_free_tokens: int | None = None) -> None:
        super().__init__(max_turns)
        self.summarize_free_tokens = summarize_free_tokens
        """Terminus-2 summarizes when fewer tokens than this are left in the context
        (None: a quarter of the session's context)."""

    async def drive(self, env: Env, handle: CaptureHandle) -> FinishReason:
        from harbor.agents.terminus_2 import Terminus2
        from harbor.models.agent.context import AgentContext

        from skyrl_agent.sandboxes.harbor_environment import SkyrlEnvironment

        config = handle.session.llm.config
        threshold = self.summarize_free_tokens
        if threshold is None:
            threshold = config.max_context_tokens // 4
        with tempfile.TemporaryDirectory(prefix="skyrl-harbor-agent-") as scratch:
            agent = Terminus2(
                logs_dir=Path(scratch) / "agent", model_name=f"openai/{MODEL_NAME}",
                api_base=handle.base_url, llm_kwargs={"api_key": handle.key},
                max_turns=self.max_turns, suppress_max_turns_warning=True,
                record_terminal_session=False, proactive_summarization_threshold=threshold,
                model_info={"max_input_tokens": config.max_context_tokens,
                            "max_output_tokens": config.max_tokens,
                            "input_cost_per_token": 0.0, "output_cost_per_token": 0.0})
            environment = SkyrlEnvironment.over(env.sandbox, env.task, Path(scratch) / "trial")
            context = AgentContext()
            await agent.setup(environment)
            await agent.run(env.instruction, environment, context)
        self.count("episodes", agent._n_episodes)
        self.count("summarizations", agent._summarization_count)
        if agent._n_episodes >= self.max_turns and not agent._pending_completion:
            return FinishReason.MAX_TURNS
        return FinishReason.STOP
