"""Demonstrations: a task's reference solution acted out by an agent, recorded like any sample.

For each task the agent's own reply format is filled with the solution's commands
(`Agent.demonstration`), a scripted teacher (agents/teacher.py) serves those replies to a real
LLMSession, and the real agent runs them in a sandbox; the episode is verified as usual. Only
demonstrations that score 1 with consistent token arrays are kept, in a run dir `sft --data`
reads. `keep_rewarded` is rejection sampling: the rewarded samples of any stored run, copied
into a new run dir.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skyrl_agent.agents.base import Agent, agent_class
from skyrl_agent.agents.session import LLMSession
from skyrl_agent.agents.teacher import Teacher
from skyrl_agent.collector.rollout import make_agent, run_rollout
from skyrl_agent.collector.run import record_of, session_config
from skyrl_agent.config import RunConfig
from skyrl_agent.data.run_dir import RunDir
from skyrl_agent.data.store import TrajectoryStore
from skyrl_agent.envs.episode import SandboxSource, fresh_sandboxes
from skyrl_agent.errors import TaskError, UserError
from skyrl_agent.sandboxes.pool import SandboxPool
from skyrl_agent.tasks.model import TaskSpec
from skyrl_agent.tasks.solution import solution_commands, solution_plan
from skyrl_agent.types import Trajectory

DEMO_SAMPLE = 0
"""The sample index of a task's demonstration (one per task)."""


@dataclass(frozen=True)
class DemoOutcome:
    """What became of one task's demonstration."""

    task: str
    kept: bool
    reward: float
    reason: str | None = None
    """Why it was dropped (None when kept)."""


def token_problem(trajectory: Trajectory) -> str | None:
    """What breaks the token-consistency rules of recorded trajectories (None: nothing): every
    segment's prompts extend the previous prompt + completion, every turn sampled something,
    its mask is 0/1 and trains at least one token."""
    if not trajectory.segments:
        return "no model turns"
    for number, segment in enumerate(trajectory.segments):
        if not segment.turns:
            return f"segment {number} has no turns"
        if not segment.is_token_consistent():
            return f"segment {number}: a prompt does not extend the turn before it"
        for turn in segment.turns:
            if not turn.completion_ids:
                return f"segment {number}: an empty completion"
            if set(turn.loss_mask) - {0, 1} or not any(turn.loss_mask):
                return f"segment {number}: a loss mask that is not 0/1 or trains nothing"
    return None


def rejection(trajectory: Trajectory, min_reward: float = 1.0) -> str | None:
    """Why a trajectory is not kept as a demonstration (None: keep it)."""
    if trajectory.metrics.get("teacher_truncated", 0.0) > 0:
        return "a reply is longer than inference.max_tokens"
    if trajectory.masked:
        return f"masked: {trajectory.mask_reason}"
    if trajectory.reward.value < min_reward:
        why = f" ({trajectory.reward.reason})" if trajectory.reward.reason else ""
        return f"reward {trajectory.reward.value:g}{why}"
    return token_problem(trajectory)


def demo_replies(agent_cls: type[Agent], task: TaskSpec) -> list[str]:
    """The agent's replies that carry out the task's reference solution."""
    return agent_cls.demonstration(solution_commands(task), solution_plan(task))


async def act_out(task: TaskSpec, agent_cls: type[Agent], config: RunConfig, tokenizer: Any,
                  replies: Sequence[str | Sequence[int]], sandboxes: SandboxSource,
                  keep_state: Path | None = None, sample_index: int = DEMO_SAMPLE) -> Trajectory:
    """One episode of the real agent whose session is served by a teacher with `replies`."""
    teacher = Teacher(tokenizer, replies)
    settings = session_config(config, None)

    def sessions(agent: Agent, session_id: str) -> LLMSession:
        return LLMSession(teacher, tokenizer, settings, tools=agent.tools, session_id=session_id)

    trajectory = await run_rollout(task, sample_index, make_agent(agent_cls, config), config,
                                   sessions, keep_state, sandboxes)
    metrics = {**trajectory.metrics, "demonstration": 1.0,
               "teacher_truncated": float(teacher.truncated)}
    return dataclasses.replace(trajectory, metrics=metrics)


async def replay(trajectory: Trajectory, task: TaskSpec, config: RunConfig,
                 tokenizer: Any) -> Trajectory:
    """Act a stored trajectory out again from its own sampled ids, in fresh sandboxes."""
    replies = [turn.completion_ids for segment in trajectory.segments for turn in segment.turns]
    return await act_out(task, agent_class(trajectory.agent), config, tokenizer, replies,
                         fresh_sandboxes(config.sandbox), sample_index=trajectory.sample_index)


def load_tokenizer(config: RunConfig) -> Any:
    from transformers import AutoTokenizer

    from skyrl_agent.inference.models import resolve_model
    return AutoTokenizer.from_pretrained(resolve_model(config.inference.model))


class DemoJob:
    """Demonstrations of an agent on tasks into a run dir; validated at construction, resumable
    (tasks whose demonstration is stored are skipped)."""

    def __init__(self, settings: RunConfig, output: Path) -> None:
        from skyrl_agent.sandboxes.base import sandbox_backend
        from skyrl_agent.sandboxes.reaper import reap_leftovers
        from skyrl_agent.tasks import resolve_tasks

        self.settings = settings
        self.agent_cls = agent_class(settings.agent.name)
        make_agent(self.agent_cls, settings)  # a broken constructor fails before any work
        try:
            self.agent_cls.demonstration(["true"], "probe")
        except NotImplementedError as exc:
            raise UserError(f"{exc} (demonstrations exist for terminus and openhands)") from None
        sandbox_backend(settings.sandbox.backend)
        tasks = resolve_tasks(settings.tasks.source, settings.tasks.include, settings.tasks.limit)
        self.run_dir = RunDir(output)
        self.run_dir.prepare(record_of(settings, 1))
        self.store = TrajectoryStore(output, writable=True)
        reap_leftovers(settings.sandbox)
        done = self.store.keys()
        self.pending = [t for t in tasks if (t.name, DEMO_SAMPLE) not in done]
        """The tasks whose demonstration is still to record."""

    async def run(self, on_done: Callable[[DemoOutcome], Any] = lambda o: None,
                  ) -> list[DemoOutcome]:
        config = self.settings
        tokenizer = await asyncio.to_thread(load_tokenizer, config)
        pool = SandboxPool(config.sandbox, size=config.sandbox.warm_pool,
                           start_timeout_s=config.collector.sandbox_start_timeout_s)
        limit = asyncio.Semaphore(config.collector.max_concurrent_sandboxes)

        async def one(task: TaskSpec) -> DemoOutcome:
            outcome = await self._demonstrate(task, tokenizer, pool, limit)
            on_done(outcome)
            return outcome

        try:
            outcomes = list(await asyncio.gather(*(one(t) for t in self.pending)))
        finally:
            await asyncio.shield(pool.close())
        await asyncio.to_thread(self.store.compact)
        return outcomes

    async def _demonstrate(self, task: TaskSpec, tokenizer: Any, pool: SandboxPool,
                           limit: asyncio.Semaphore) -> DemoOutcome:
        try:
            replies = demo_replies(self.agent_cls, task)
        except (TaskError, NotImplementedError) as exc:
            return DemoOutcome(task.name, False, 0.0, str(exc))
        state = self.run_dir.state_path(task.name, DEMO_SAMPLE)
        async with limit:
            trajectory = await act_out(task, self.agent_cls, self.settings, tokenizer, replies,
                                       pool, keep_state=state)
        why = rejection(trajectory)
        if why is None:
            await asyncio.to_thread(self.store.append, [trajectory])
        else:
            state.unlink(missing_ok=True)  # a final state only for stored samples
        return DemoOutcome(task.name, why is None, trajectory.reward.value, why)

    def close(self) -> None:
        self.store.close()


@dataclass(frozen=True)
class KeptRun:
    """What rejection sampling kept of a stored run."""

    kept: int
    total: int
    reasons: dict[str, int]
    """How many were dropped, by reason (reward values are grouped)."""


def keep_rewarded(source: Path, output: Path, min_reward: float = 1.0) -> KeptRun:
    """Copy the unmasked trajectories of `source` that reached `min_reward` (and pass the token
    checks) into the run dir `output`, final states included: rejection sampling."""
    if source.resolve() == output.resolve():
        raise UserError("--from and --output must be different run dirs")
    record = RunDir(source).record()
    if record is None:
        raise UserError(f"{source} has no readable config.json (not a run dir)")
    contents = TrajectoryStore(source).load()
    reasons: dict[str, int] = {}
    kept = []
    for trajectory in contents.trajectories:
        why = rejection(trajectory, min_reward)
        if why is None:
            kept.append(trajectory)
        else:
            key = "reward below the minimum" if why.startswith("reward ") else why
            reasons[key] = reasons.get(key, 0) + 1
    out = RunDir(output)
    out.prepare(record)
    store = TrajectoryStore(output, writable=True)
    try:
        store.append(kept)
        for t in kept:
            state = RunDir(source).state_path(t.task_id, t.sample_index)
            if state.is_file():
                out.state_path(t.task_id, t.sample_index).parent.mkdir(parents=True,
                                                                       exist_ok=True)
                shutil.copyfile(state, out.state_path(t.task_id, t.sample_index))
        store.compact()
    finally:
        store.close()
    return KeptRun(len(kept), len(contents.trajectories), reasons)
