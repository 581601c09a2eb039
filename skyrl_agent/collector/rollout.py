"""One rollout: start a sandbox, let the agent act through an LLM session, verify, record.

Every failure becomes a trajectory with its reason, never an exception: a sandbox that will not
start or dies, an agent that crashes or runs past its deadline, a model server that fails.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from skyrl_agent.agents.base import Agent, AgentResult
from skyrl_agent.agents.session import LLMSession
from skyrl_agent.collector import final_state
from skyrl_agent.config import RunConfig
from skyrl_agent.envs.env import Env
from skyrl_agent.inference.client import InferenceError
from skyrl_agent.sandboxes.base import (
    SandboxError,
    SandboxSpec,
    UnsupportedEnvironment,
    create_sandbox,
)
from skyrl_agent.tasks.model import TaskSpec
from skyrl_agent.types import FinishReason, Reward, Trajectory

log = logging.getLogger(__name__)
SessionFactory = Callable[[Agent, str], LLMSession]
"""Builds the LLM session for an agent and a session id."""


def make_agent(agent_cls: type[Agent], config: RunConfig) -> Agent:
    try:
        return agent_cls(max_turns=config.agent.max_turns)  # type: ignore[call-arg]
    except TypeError:  # a plug-in agent with its own constructor
        return agent_cls()


async def run_rollout(task: TaskSpec, sample_index: int, agent: Agent, config: RunConfig,
                      sessions: SessionFactory | None,
                      keep_state: Path | None = None) -> Trajectory:
    """One agent attempt at one task, as a Trajectory (masked with a reason on failure).

    With `keep_state`, the agent's final working directory is saved there before verification.
    """
    session_id = f"{task.name}#{sample_index}#{time.monotonic_ns()}"
    session = sessions(agent, session_id) if agent.needs_model and sessions else None
    times: dict[str, float] = {}
    started = time.monotonic()
    sandbox = create_sandbox(SandboxSpec.from_task(task, config.sandbox), config.sandbox)
    try:
        try:
            await asyncio.wait_for(sandbox.start(), config.collector.sandbox_start_timeout_s)
        except TimeoutError:
            raise SandboxError(
                f"start took over {config.collector.sandbox_start_timeout_s:g} s") from None
        times["sandbox"] = time.monotonic() - started
        env = Env(task, sandbox)
        outcome = await _run_agent(agent, env, session, config, task, times)
        if keep_state is not None:
            why_not = await final_state.capture(env, keep_state)
            if why_not:
                log.info("final state of %s not kept: %s", task.name, why_not)
        # The verifier bounds each test run itself; this bounds the whole phase.
        reward = await asyncio.wait_for(env.verify(), task.verifier_timeout_s + 120)
    except TimeoutError:
        reward = Reward.failed(f"verification took over {task.verifier_timeout_s + 120:g} s")
        outcome = (FinishReason.ERROR, "verification deadline", {})
    except UnsupportedEnvironment as exc:  # a property of the task: retrying cannot help
        return _trajectory(task, sample_index, agent, session, Reward.failed(f"sandbox: {exc}"),
                           FinishReason.SANDBOX_ERROR, f"unsupported environment: {exc}", times,
                           {})
    except SandboxError as exc:
        return _trajectory(task, sample_index, agent, session, Reward.failed(f"sandbox: {exc}"),
                           FinishReason.SANDBOX_ERROR, f"sandbox error: {exc}", times, {})
    finally:
        await asyncio.shield(sandbox.stop())
        if session is not None:
            session.close()
    finish, mask_reason, metrics = outcome
    return _trajectory(task, sample_index, agent, session, reward, finish, mask_reason, times,
                       metrics)


async def _run_agent(agent: Agent, env: Env, session: LLMSession | None, config: RunConfig,
                     task: TaskSpec, times: dict[str, float],
                     ) -> tuple[FinishReason, str | None, dict[str, float]]:
    timeout = config.agent.timeout_s or task.agent_timeout_s
    started = time.monotonic()
    try:
        result = await asyncio.wait_for(agent.run(env, session), timeout=timeout)
    except TimeoutError:
        return FinishReason.AGENT_TIMEOUT, f"agent timed out after {timeout:g} s", {}
    except SandboxError:
        raise
    except InferenceError as exc:
        return FinishReason.ERROR, f"model server: {exc}", {}
    except Exception as exc:  # noqa: BLE001 - an agent bug must not stop the other rollouts
        log.warning("agent %s crashed on %s", agent.name, task.name, exc_info=True)
        return FinishReason.ERROR, f"agent crashed: {type(exc).__name__}: {exc}", {}
    finally:
        times["agent"] = time.monotonic() - started
    result = result or AgentResult()
    return result.finish_reason, None, dict(result.metrics)


def _trajectory(task: TaskSpec, sample_index: int, agent: Agent, session: LLMSession | None,
                reward: Reward, finish: FinishReason, mask_reason: str | None,
                times: dict[str, float], metrics: dict[str, Any]) -> Trajectory:
    if session is not None:
        metrics = {**session.metrics(), **metrics}
    return Trajectory(
        task_id=task.name, sample_index=sample_index, agent=agent.name,
        segments=session.segments if session is not None else (), reward=reward,
        finish_reason=finish, masked=mask_reason is not None, mask_reason=mask_reason,
        sandbox_time_s=times.get("sandbox", 0.0), agent_time_s=times.get("agent", 0.0),
        verify_time_s=reward.verify_time_s, metrics=metrics)
