"""One rollout: start a sandbox, let the agent act through an LLM session, verify, record.

Every failure becomes a trajectory with its reason and FailureKind, never an exception. It is
masked (no gradient) when the default error policy says its reward is not valid (policy.py:
infrastructure failures, unsupported environments); the collector applies the run's overrides.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from skyrl_agent.agents.base import Agent, run_agent
from skyrl_agent.collector.policy import MASKED_FAILURES
from skyrl_agent.config import RunConfig
from skyrl_agent.envs.env import Env
from skyrl_agent.envs.episode import (
    AgentOutcome,
    EpisodeResult,
    SandboxSource,
    fresh_sandboxes,
    run_episode,
)
from skyrl_agent.envs.verifier import SEPARATE
from skyrl_agent.errors import UserError
from skyrl_agent.llm.session import LLMSession
from skyrl_agent.tasks.spec import TaskSpec
from skyrl_agent.types import Trajectory

log = logging.getLogger(__name__)
SessionFactory = Callable[[Agent, str], LLMSession]
"""Builds the LLM session for an agent and a session id."""


def sample_seed(run_seed: int, task_id: str, sample_index: int) -> int:
    """The sampling seed of one sample: the same run seed, task and index give the same tokens
    (on a server that honours per-request seeds), whatever order samples run in."""
    return zlib.crc32(f"{run_seed}/{task_id}/{sample_index}".encode())


def make_agent(agent_cls: type[Agent], config: RunConfig) -> Agent:
    """A fresh agent, given the run's max_turns when its constructor takes it (a plug-in's own
    constructor may not). A constructor that fails is a UserError naming the plug-in: the old
    retry on any TypeError hid its bugs and silently dropped max_turns."""
    kwargs = {"max_turns": config.agent.max_turns} if _takes_max_turns(agent_cls) else {}
    try:
        return agent_cls(**kwargs)
    except Exception as exc:
        raise _cannot_create(agent_cls, config.agent.name, exc) from exc


def _cannot_create(agent_cls: type[Agent], configured: str, exc: Exception) -> UserError:
    name = getattr(agent_cls, "name", None) or configured
    where = f"{getattr(agent_cls, '__module__', '?')}.{getattr(agent_cls, '__qualname__', '?')}"
    detail = (str(exc).strip().splitlines() or [""])[0]
    return UserError(f"agent {name!r} ({where}) cannot be created: "
                     f"{type(exc).__name__}: {detail}")


def _takes_max_turns(factory: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # no signature to read: pass nothing
        return False
    return any(p.kind is p.VAR_KEYWORD or (p.name == "max_turns" and p.kind in
               (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)) for p in params)


async def run_rollout(task: TaskSpec, sample_index: int, agent: Agent, config: RunConfig,
                      sessions: SessionFactory | None, keep_state: Path | None = None,
                      sandboxes: SandboxSource | None = None) -> Trajectory:
    """One agent attempt at one task, as a Trajectory (masked with a reason on failure).

    With `keep_state`, the collected artifacts (the final state) are saved there.
    """
    session_id = f"{task.name}#{sample_index}#{time.monotonic_ns()}"
    session = sessions(agent, session_id) if agent.needs_model and sessions else None
    if session is not None:
        session.seed = sample_seed(config.seed, task.name, sample_index)
    timeout = config.agent.timeout_s or task.agent_timeout_s
    source = sandboxes or fresh_sandboxes(config.sandbox, config.collector.sandbox_start_timeout_s)

    measuring: list[asyncio.Future[dict[str, float]]] = []

    async def act(env: Env) -> AgentOutcome:
        try:
            return await run_agent(agent, env, session, timeout)
        finally:  # sampling is over: its metrics (a full re-render) are made while it verifies
            if session is not None:
                measuring.append(asyncio.ensure_future(asyncio.to_thread(session.metrics)))

    try:
        episode = await run_episode(task, act, source, config.verifier, keep_state)
    finally:
        if session is not None:
            session.close()
    session_metrics = {} if session is None else await _measured(measuring, session)
    return _trajectory(task, sample_index, agent, session, episode, session_metrics)


async def _measured(measuring: list[asyncio.Future[dict[str, float]]],
                    session: LLMSession) -> dict[str, float]:
    """The session's metrics as measured in a thread while the episode verified; made here
    when there was no agent phase, or when that failed (a measure never costs a sample)."""
    if measuring:
        try:
            return await measuring[0]
        except Exception as exc:  # noqa: BLE001 - e.g. the tokenizer busy in another thread
            log.warning("session metrics failed in a thread (%s); measured again", exc)
    return session.metrics()


def _trajectory(task: TaskSpec, sample_index: int, agent: Agent, session: LLMSession | None,
                episode: EpisodeResult, session_metrics: dict[str, float]) -> Trajectory:
    outcome = episode.outcome
    metrics: dict[str, Any] = {**session_metrics, **outcome.metrics,
                               "verified_separately": float(episode.mode == SEPARATE)}
    masked = outcome.failure in MASKED_FAILURES
    return Trajectory(
        task_id=task.name, sample_index=sample_index, agent=agent.name,
        segments=session.segments if session is not None else (), reward=episode.reward,
        finish_reason=outcome.finish_reason, masked=masked,
        mask_reason=outcome.reason if masked else None, failure=outcome.failure,
        sandbox_time_s=episode.sandbox_time_s, agent_time_s=episode.agent_time_s,
        verify_time_s=episode.reward.verify_time_s,
        model_time_s=session.model_time_s if session is not None else 0.0,
        exec_time_s=episode.exec_time_s, handover_time_s=episode.handover_time_s,
        stop_time_s=episode.stop_time_s, total_time_s=episode.total_time_s,
        collect_time_s=episode.collect_time_s, metrics=metrics)
