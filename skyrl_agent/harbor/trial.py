"""Any Harbor agent in a Harbor trial, recorded token-exactly: `harbor run`'s lifecycle with the
agent's model calls going through our capture proxy, stored as a trajectory of a run dir.

The trial is Harbor's own (its agent setup, its verifier, its result), in our sandbox as a Harbor
environment; only the model endpoint is ours. The agent is pointed at the proxy the way Harbor's
litellm agents take an endpoint (`api_base` plus the session key as API key), so every call is
one recorded turn, and history rewrites start new segments. The stored reward is the trial's:
Harbor verifies in the agent's own environment after it stops (its default mode), which is
weaker than our separate-mode episodes; `eval --regrade` re-grades stored states our way only
for runs made by `rollout`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from skyrl_agent.capture import CaptureProxy
from skyrl_agent.harbor.results import (
    OWN_ERROR_POLICY,
    harbor_error,
    harbor_reward,
    harbor_times,
)
from skyrl_agent.llm.session import LLMSession
from skyrl_agent.tasks.spec import TaskSpec
from skyrl_agent.types import Trajectory

MODEL_NAME = "skyrl-agent"
ENVIRONMENT = "skyrl_agent.harbor:SkyrlEnvironment"


def _agent_kwargs(llm: LLMSession, base_url: str, key: str) -> dict[str, Any]:
    """How a litellm-based Harbor agent (terminus-2 and its kin) is told about the endpoint."""
    config = llm.config
    return {"api_base": base_url, "llm_kwargs": {"api_key": key},
            "model_info": {"max_input_tokens": config.max_context_tokens,
                           "max_output_tokens": config.max_tokens,
                           "input_cost_per_token": 0.0, "output_cost_per_token": 0.0}}


async def harbor_trial(task: TaskSpec, agent_name: str, llm: LLMSession, trials_dir: Path,
                       sample_index: int = 0, agent_kwargs: dict[str, Any] | None = None,
                       environment_kwargs: dict[str, Any] | None = None) -> Trajectory:
    """Run Harbor's agent `agent_name` on `task` in a Harbor trial whose model calls go
    through `llm`; the trial as one of our trajectories."""
    from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
    from harbor.trial.trial import Trial

    async with CaptureProxy(model_name=MODEL_NAME) as proxy:
        handle = proxy.open(llm)
        try:
            config = TrialConfig(
                task=TaskConfig(path=task.task_dir), trials_dir=trials_dir,
                agent=AgentConfig(name=agent_name, model_name=f"openai/{MODEL_NAME}",
                                  kwargs={**_agent_kwargs(llm, handle.base_url, handle.key),
                                          **(agent_kwargs or {})}),
                environment=EnvironmentConfig(import_path=ENVIRONMENT,
                                              kwargs=environment_kwargs or {}),
                override_error_policy=OWN_ERROR_POLICY)
            result = await (await Trial.create(config)).run()
        finally:
            proxy.close(handle)
    error = result.exception_info
    # Harbor's own decision on the trial's error (its policy table and overrides).
    decided = harbor_error(error.exception_type if error else None)
    masked = error is not None and not error.policy.has_valid_reward
    why = f"{error.exception_type}: {error.exception_message}" if error else None
    rewards = result.verifier_result.rewards if result.verifier_result else None
    return Trajectory(
        task_id=task.name, sample_index=sample_index, agent=f"harbor:{agent_name}",
        segments=llm.segments,
        reward=harbor_reward(rewards, why or "the trial produced no reward", decided),
        finish_reason=decided.finish_reason, failure=decided.failure,
        mask_reason=why if masked else None, masked=masked,
        **harbor_times(result), model_time_s=llm.model_time_s,
        metrics={**handle.session.metrics(), "harbor_trial": 1.0})
