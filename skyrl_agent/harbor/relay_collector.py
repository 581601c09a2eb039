"""Training samples from Harbor's own agents, unmodified: `train --agent harbor:<name>`.

Each group is one Harbor job on a `harbor serve` of this run (127.0.0.1, its own key) with the
inference relay on: Harbor runs the agent (terminus-2 on the host; mini-swe-agent or the
OpenHands SDK inside our sandbox, given their programs by toolchains.py), our environment and
its verifier, `n_attempts` = the group size. Every model call comes back through the relay to
our connector and capture proxy, which record each rollout token-exactly against the run's
model servers; the finished job becomes the group's trajectories (relay_job.py) with Harbor's
rewards and error policy, stored before the trainer sees them, like the Collector's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from skyrl_agent.agents.base import Agent, AgentResult
from skyrl_agent.capture import CaptureProxy
from skyrl_agent.collector.collector import TrajectorySink, stored_samples
from skyrl_agent.collector.one_sample import SessionFactory, make_agent
from skyrl_agent.collector.policy import FailurePolicy
from skyrl_agent.config import RunConfig
from skyrl_agent.envs.env import Env
from skyrl_agent.errors import UserError
from skyrl_agent.harbor.relay import RelayConnector
from skyrl_agent.harbor.relay_job import job_trajectories, wait_for_job
from skyrl_agent.harbor.results import OWN_ERROR_POLICY
from skyrl_agent.harbor.serve import harbor_serving
from skyrl_agent.harbor.toolchains import toolchain
from skyrl_agent.llm.session import LLMSession
from skyrl_agent.tasks.spec import TaskSpec
from skyrl_agent.types import Trajectory, TrajectoryGroup

log = logging.getLogger(__name__)
PREFIX = "harbor:"
"""`--agent harbor:<name>` names one of Harbor's registered agents."""
MODEL_NAME = "openai/skyrl-agent"
ENVIRONMENT = "skyrl_agent.harbor:SkyrlEnvironment"
JOB_TIMEOUT_S = 4 * 3600.0


class RelayedHarborAgent(Agent):
    """Stands for a Harbor agent in the agent slot of a run: its samples are Harbor rollouts
    (RelayedCollector), so it never acts in an episode of ours."""

    harbor_name: ClassVar[str]

    async def run(self, env: Env, llm: LLMSession | None) -> AgentResult | None:
        raise RuntimeError(f"{self.name} runs in Harbor's trials: train or collect with "
                           "RelayedCollector")


def relayed_agent_class(name: str) -> type[RelayedHarborAgent]:
    """The stand-in for `harbor:<agent>`; an agent Harbor does not register is a UserError."""
    from harbor.models.agent.name import AgentName

    agent = name.removeprefix(PREFIX)
    known = sorted(a.value for a in AgentName)
    if agent not in known:
        raise UserError(f"harbor has no agent {agent!r}; its agents: {', '.join(known)}")
    if os.geteuid() != 0:  # else every rollout would fail in Harbor, one by one
        raise UserError(f"{name} needs root: its sandboxes reach Harbor's relay through a "
                        "socket opened in their network namespace")
    return type(f"Relayed_{agent.replace('-', '_')}", (RelayedHarborAgent,),
                {"name": name, "harbor_name": agent})


def agent_settings(agent: str, config: RunConfig) -> dict[str, Any]:
    """Our agent limits in the words of Harbor's adapter for `agent` (AgentConfig fields)."""
    turns, tokens = config.agent.max_turns, config.inference.max_tokens
    if agent == "terminus-2":
        return {"kwargs": {"max_turns": turns, "record_terminal_session": False, "model_info": {
            "max_input_tokens": config.agent.max_context_tokens, "max_output_tokens": tokens,
            "input_cost_per_token": 0.0, "output_cost_per_token": 0.0}}}
    if agent == "mini-swe-agent":
        # A config of its own makes the adapter ask for the wire format explicitly.
        return {"model_api_format": "openai_chat_completions", "kwargs": {
            "max_tokens": tokens, "config": {"agent": {"step_limit": turns}}}}
    if agent == "openhands-sdk":
        return {"kwargs": {"max_iterations": turns}}
    return {"kwargs": {}}


class RelayedCollector:
    """A collector (run_group, close) whose samples are rollouts of Harbor jobs."""

    def __init__(self, config: RunConfig, agent_cls: type[RelayedHarborAgent],
                 store: TrajectorySink, sessions: SessionFactory) -> None:
        self.config = config
        self.agent = agent_cls.harbor_name
        self.store = store
        self.policy = FailurePolicy(config.collector)
        self._stand_in = make_agent(agent_cls, config)
        self._sessions = sessions
        self._stack = contextlib.AsyncExitStack()
        self._started: asyncio.Task[None] | None = None
        self._stored: dict[tuple[str, int], Trajectory] | None = None
        self.jobs = 0

    async def _start(self) -> None:
        stack = self._stack
        scratch = await asyncio.to_thread(_reachable_folder)
        stack.callback(shutil.rmtree, scratch, True)
        self._scratch = scratch
        self.harbor = await stack.enter_async_context(harbor_serving(Path(self.store.run_dir)))
        proxy = await stack.enter_async_context(CaptureProxy())
        self.rollouts = proxy.open_rollouts(lambda rollout: self._sessions(self._stand_in,
                                                                           rollout))
        self.connector = RelayConnector(self.harbor.url, self.harbor.api_key, proxy.url,
                                        self.rollouts.key)
        connection = asyncio.create_task(self.connector.run())
        stack.push_async_callback(_cancelled, connection)
        await asyncio.wait_for(self.connector.ready.wait(), 60)
        from harbor.client import AsyncHarbor
        self.api = await stack.enter_async_context(
            AsyncHarbor(base_url=self.harbor.url, api_key=self.harbor.api_key))
        log.info("harbor serve ready at %s; %s runs through its relay", self.harbor.url,
                 self.agent)

    async def _ready(self) -> None:
        if self._started is None:
            self._started = asyncio.create_task(self._start())
        await asyncio.shield(self._started)

    def job_config(self, task: TaskSpec, attempts: int) -> dict[str, Any]:
        """The Harbor job of `attempts` samples of `task`."""
        tools = toolchain(self.agent, self._scratch)
        settings = agent_settings(self.agent, self.config)
        sandbox = self.config.sandbox
        options: dict[str, Any] = {"backend": sandbox.backend, "relay_url": self.harbor.url}
        if sandbox.work_root is not None:
            options["work_root"] = str(sandbox.work_root)
        return {
            "job_name": f"{task.name.replace('/', '__')}-{self.jobs}", "n_attempts": attempts,
            "n_concurrent_trials": min(attempts, self.config.collector.max_concurrent_sandboxes),
            "retry": {"max_retries": self.config.collector.infra_retries},
            # A sandbox ended for what ran in it is the sample's: not retried, not graded.
            "override_error_policy": OWN_ERROR_POLICY,
            "tasks": [{"path": str(task.task_dir)}],
            "agents": [{**settings, "name": self.agent, "model_name": MODEL_NAME,
                        "kwargs": {**settings["kwargs"], **tools.agent_kwargs},
                        "env": tools.agent_env}],
            "environment": {"import_path": ENVIRONMENT, "mounts": tools.mounts,
                            "kwargs": options},
        }

    async def run_group(self, task: TaskSpec, indices: Sequence[int]) -> TrajectoryGroup:
        """The samples `indices` of `task`; those the store holds are read back."""
        if self._stored is None:
            self._stored = await stored_samples(self.store)
        missing = [i for i in indices if (task.name, i) not in self._stored]
        fresh = await self._job(task, missing) if missing else []
        await asyncio.to_thread(self.store.append, fresh)  # on disk before handed on
        held = [self._stored[(task.name, i)] for i in indices if i not in missing]
        return self.policy.group(task.name, held + fresh)

    async def _job(self, task: TaskSpec, indices: list[int]) -> list[Trajectory]:
        await self._ready()
        self.jobs += 1
        submitted = await self.api.jobs.submit(
            self.job_config(task, len(indices)), relay_inference=True,
            session_id=self.connector.session_id)
        try:
            job = await wait_for_job(self.api, submitted.job_id, JOB_TIMEOUT_S)
        except BaseException:  # e.g. the run ended while this group ran: so does the job
            with contextlib.suppress(Exception):
                await asyncio.shield(self.api.jobs.cancel(submitted.job_id))
            raise
        listed = (await self.api.rollouts.list(job_ids=[job.id])).items
        details = [await self.api.rollouts.get(r.id) for r in listed]
        made = job_trajectories(details, self.rollouts, self.agent,
                                {task.task_dir.resolve(): task.name})
        for rollout in listed:  # recorded into `made`: the proxy need not hold them on
            self.rollouts.sessions.pop(str(rollout.id), None)
            self.rollouts.requests.pop(str(rollout.id), None)
        if len(made) != len(indices):
            log.warning("harbor job %s gave %d rollouts for %d samples of %s", job.id,
                        len(made), len(indices), task.name)
        # Harbor numbers a job's samples from 0; these are the group's own indices.
        return [dataclasses.replace(t, sample_index=index)
                for t, index in zip(made, indices, strict=False)]

    async def close(self) -> None:
        await asyncio.shield(self._stack.aclose())


def _reachable_folder() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="skyrl-relayed-"))
    folder.chmod(0o755)  # the sandbox user reads the toolchain links there
    return folder


async def _cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
