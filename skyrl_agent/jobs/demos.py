"""The demonstrations job (`skyrl-agent demos`): each task's reference solution acted out by an
agent (collector/demos.py) into a run dir `sft --data` reads; `keep_rewarded` is rejection
sampling, the rewarded samples of any stored run copied into a new run dir.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skyrl_agent.agents.base import Agent, agent_class
from skyrl_agent.collector.demos import (
    DEMO_SAMPLE,
    act_out,
    demo_script,
    load_tokenizer,
    rejection,
)
from skyrl_agent.config import RunConfig
from skyrl_agent.data.run_dir import RunDir
from skyrl_agent.data.store import TrajectoryStore
from skyrl_agent.errors import TaskError, UserError
from skyrl_agent.jobs.prepare import COPY, DEMOS, prepare_run, record_of
from skyrl_agent.sandboxes.pool import SandboxPool
from skyrl_agent.tasks.spec import TaskSpec


def _check_demonstrable(agent_cls: type[Agent]) -> None:
    try:
        agent_cls.demonstration(["true"], "probe")
    except NotImplementedError as exc:
        raise UserError(f"{exc} (demonstrations exist for terminus and openhands)") from None


@dataclass(frozen=True)
class DemoOutcome:
    """What became of one task's demonstration."""

    task: str
    kept: bool
    reward: float
    reason: str | None = None
    """Why it was dropped (None when kept)."""


class DemoJob:
    """Demonstrations of an agent on tasks into a run dir; validated at construction, resumable
    (tasks whose demonstration is stored are skipped)."""

    def __init__(self, settings: RunConfig, output: Path) -> None:
        self.settings = settings
        _check_demonstrable(agent_class(settings.agent.name))
        prepared = prepare_run(settings, DEMOS, output, record_of(settings, 1))
        assert prepared.run_dir and prepared.store is not None  # DEMOS opens both
        self.agent_cls = prepared.agent
        self.run_dir = prepared.run_dir
        self.store = prepared.store
        done = self.store.keys()
        self.pending = [t for t in prepared.tasks if (t.name, DEMO_SAMPLE) not in done]
        """The tasks whose demonstration is still to record."""

    async def run(self, on_done: Callable[[DemoOutcome], Any] = lambda o: None,
                  ) -> list[DemoOutcome]:
        config = self.settings
        tokenizer = await asyncio.to_thread(load_tokenizer, config)
        pool = SandboxPool(config.sandbox, size=config.sandbox.warm_pool,
                           start_timeout_s=config.collector.sandbox_start_timeout_s,
                           stop_in_background=True,
                           limit=config.collector.max_concurrent_sandboxes)
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
            script = demo_script(self.agent_cls, task)
        except (TaskError, NotImplementedError) as exc:
            return DemoOutcome(task.name, False, 0.0, str(exc))
        state = self.run_dir.state_path(task.name, DEMO_SAMPLE)
        async with limit:
            trajectory = await act_out(task, self.agent_cls, self.settings, tokenizer, script,
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
    prepared = prepare_run(RunConfig(), COPY, output, record)  # copies what `record` pins
    assert prepared.run_dir and prepared.store is not None  # COPY opens both
    out, store = prepared.run_dir, prepared.store
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
