"""Our agents as Harbor agents: `harbor run -a skyrl_agent.harbor:TerminusHarborAgent`.

The agent acts in the environment the trial hands it (through the `harbor:` sandbox adapter)
and talks to any OpenAI-compatible endpoint that takes token-id prompts (`--ak endpoint=URL`)
through the same token-exact LLMSession as our own runs. Each segment
of the session (a self-summarization starts a new one) becomes one entry of the trial's
`rollout_details`: per turn the full prompt ids, the sampled ids and their logprobs, and the
policy version of each sampled token.

Agent kwargs (`--ak key=value`): `endpoint` (required), `tokenizer` (a model folder or built-in
name; default: the model name), and `settings`, a mapping of our config overrides (e.g.
{"agent.max_turns": 10, "agent.max_context_tokens": 4096}).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext
from harbor.models.agent.rollout_detail import RolloutDetail

from skyrl_agent import __version__
from skyrl_agent.agents.base import agent_class
from skyrl_agent.collector.model_access import session_config
from skyrl_agent.collector.one_sample import make_agent
from skyrl_agent.config import RunConfig, load_config
from skyrl_agent.envs.env import Env
from skyrl_agent.inference.client import InferenceClient
from skyrl_agent.llm.session import LLMSession
from skyrl_agent.sandboxes.base import SandboxSpec
from skyrl_agent.sandboxes.harbor import HarborSandbox
from skyrl_agent.tasks.spec import load_task
from skyrl_agent.types import Segment


def rollout_detail(segment: Segment) -> RolloutDetail:
    """One segment as Harbor's RolloutDetail (one training sequence)."""
    return RolloutDetail(
        prompt_token_ids=[list(t.prompt_ids) for t in segment.turns],
        completion_token_ids=[list(t.completion_ids) for t in segment.turns],
        logprobs=[list(t.completion_logprobs) for t in segment.turns],
        extra={"token_policy_versions": [
            list(t.token_policy_versions or (t.policy_version,) * len(t.completion_ids))
            for t in segment.turns]})


class SkyrlHarborAgent(BaseAgent):
    """A registered skyrl-agent agent (`agent_name`) run inside a Harbor trial."""

    agent_name: ClassVar[str]

    def __init__(self, logs_dir: Path, model_name: str | None = None, *args: Any,
                 endpoint: str | None = None, tokenizer: str | None = None,
                 settings: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(logs_dir, model_name, *args, **kwargs)
        self.endpoint = endpoint
        self.tokenizer_name = tokenizer or (model_name or "").split("/")[-1] or None
        self.overrides = [f"{key}={value}" for key, value in (settings or {}).items()]

    @classmethod
    def name(cls) -> str:
        return f"skyrl-{cls.agent_name}"

    def version(self) -> str | None:
        return __version__

    async def setup(self, environment: BaseEnvironment) -> None:
        """Nothing to install: the agent runs here and acts through the environment."""

    def _config(self) -> RunConfig:
        if not self.endpoint:
            raise ValueError(f"{self.name()} needs the model endpoint: pass endpoint=URL")
        return load_config(None, self.overrides, {"inference.endpoint": self.endpoint,
                                                  "agent.name": self.agent_name})

    async def run(self, instruction: str, environment: BaseEnvironment,
                  context: AgentContext) -> None:
        from transformers import AutoTokenizer

        from skyrl_agent.model.names import resolve_model
        from skyrl_agent.model.vision import tokenizer_images

        config = self._config()
        if not self.tokenizer_name:
            raise ValueError(f"{self.name()} needs a tokenizer: pass tokenizer= or a model name")
        tokenizer = AutoTokenizer.from_pretrained(resolve_model(self.tokenizer_name))
        task = dataclasses.replace(load_task(Path(environment.environment_dir).parent),
                                   instruction=instruction)
        sandbox = HarborSandbox.wrapping(environment, SandboxSpec.from_task(task, config.sandbox))
        agent = make_agent(agent_class(self.agent_name), config)
        async with InferenceClient([config.inference.endpoint or ""]) as client:
            settings = session_config(config, await client.max_model_len())
            images = tokenizer_images(tokenizer)
            session = LLMSession(client, tokenizer, settings,
                                 tools=agent.tools_for(images is not None),
                                 session_id=self.session_id, images=images)
            try:
                result = await agent.run(Env(task, sandbox), session)
            finally:
                _record(context, session)
                session.close()
        context.metadata = {**(context.metadata or {}),
                            "finish_reason": str(result.finish_reason) if result else "stop"}


def _record(context: AgentContext, session: LLMSession) -> None:
    """What the session sampled, token-exactly, into the trial's context."""
    segments = session.segments
    turns = [turn for segment in segments for turn in segment.turns]
    context.rollout_details = [rollout_detail(s) for s in segments]
    context.n_input_tokens = sum(len(t.prompt_ids) for t in turns)
    context.n_output_tokens = sum(len(t.completion_ids) for t in turns)
    context.metadata = {**(context.metadata or {}), "summaries": session.summaries,
                        "turns": len(turns)}


class TerminusHarborAgent(SkyrlHarborAgent):
    """Our Terminus agent (tmux keystrokes) in a Harbor trial."""

    agent_name = "terminus"


class CodeActHarborAgent(SkyrlHarborAgent):
    """Our CodeAct agent (function-calling tools) in a Harbor trial."""

    agent_name = "openhands"
