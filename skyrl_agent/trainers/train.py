"""A training run: validated before any work, resumable from its run dir.

    RUN_DIR/config.json      the settings (a resumed run must use the same)
    RUN_DIR/trajectories/    every sampled trajectory (the store)
    RUN_DIR/checkpoints/     the newest checkpoints (weights, optimizer, RNG, loop state)
    RUN_DIR/metrics.jsonl    per-step metrics; RUN_DIR/tensorboard/ the same for TensorBoard
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from skyrl_agent.agents.base import agent_class
from skyrl_agent.collector.collector import Collector
from skyrl_agent.collector.run import model_sessions, supervised
from skyrl_agent.config import RunConfig
from skyrl_agent.data.run_dir import RunDir, RunRecord
from skyrl_agent.data.store import TrajectoryStore
from skyrl_agent.errors import UserError
from skyrl_agent.tasks.families import refuse_heldout
from skyrl_agent.tasks.model import TaskSpec
from skyrl_agent.trainers.checkpoints import Checkpoints, LoopState
from skyrl_agent.trainers.loop import AsyncLoop
from skyrl_agent.trainers.metrics import MetricsLog
from skyrl_agent.trainers.reference_loop import StepResult, publish
from skyrl_agent.trainers.settings import check_trainable, make_backend
from skyrl_agent.trainers.stream import TaskStream

log = logging.getLogger(__name__)


RESUMABLE_CHANGES = {"max_steps", "checkpoint_every"}
"""Trainer settings a resumed run may change: how long it goes on and how often it saves."""


def train_record(config: RunConfig) -> RunRecord:
    """What a training run records: everything but concurrency and where the run dir lives."""
    settings = json.loads(config.model_dump_json(exclude={"collector", "output_dir"}))
    return RunRecord(n=config.collector.n_samples_per_task, config=settings)


def _pinned(record: RunRecord) -> RunRecord:
    trainer = {k: v for k, v in (record.section("trainer") or {}).items()
               if k not in RESUMABLE_CHANGES}
    return RunRecord(record.n, {**record.config, "trainer": trainer})


class TrainJob:
    """One training run. Construction validates everything and prepares the run dir."""

    def __init__(self, config: RunConfig, output: Path, resume: bool = False) -> None:
        from skyrl_agent.inference.models import resolve_model
        from skyrl_agent.sandboxes.base import sandbox_backend
        from skyrl_agent.tasks import resolve_tasks

        check_trainable(config)
        self.config = config
        self.run_dir = RunDir(output)
        self.agent_cls = agent_class(config.agent.name)
        if not self.agent_cls.needs_model:
            raise UserError(f"agent {config.agent.name!r} never calls the model: nothing to "
                            "train (choose terminus, openhands or answer)")
        sandbox_backend(config.sandbox.backend)
        self.model_folder = resolve_model(config.inference.model)
        self.tasks: list[TaskSpec] = resolve_tasks(
            config.tasks.source, config.tasks.include, config.tasks.limit)
        refuse_heldout((t.name for t in self.tasks), f"--tasks {config.tasks.source}")
        self.checkpoints = Checkpoints(output)
        self.resume = resume
        if self.run_dir.config_file.exists() and not resume:
            raise UserError(f"{output} already holds a training run: add --resume to continue "
                            "it, or choose another --output")
        if resume:
            self._check_resumable()

    def plan(self) -> str:
        """What the run will do, in a few lines (`train --dry-run`)."""
        trainer = self.config.trainer
        per_step = trainer.groups_per_step or len(self.tasks)
        n = self.config.collector.n_samples_per_task
        latest = self.checkpoints.latest() if self.resume else None
        return "\n".join([
            f"agent {self.config.agent.name} on {len(self.tasks)} tasks of "
            f"{self.config.tasks.source}; model {self.model_folder}",
            f"{trainer.max_steps} steps of {per_step} groups x {n} samples; "
            f"{trainer.advantage} advantages, {trainer.loss_fn} loss, {trainer.reduction}, "
            f"correction {trainer.correction}, lr {trainer.learning_rate:g}"
            + (f", LoRA rank {trainer.lora_rank}" if trainer.lora_rank else ", full fine-tune"),
            f"max staleness {trainer.max_staleness}; checkpoint every "
            f"{trainer.checkpoint_every} steps into {self.run_dir.checkpoints}",
            f"resume from {latest}" if latest else "starting from the model's weights",
        ])

    def _check_resumable(self) -> None:
        before = self.run_dir.record()
        if before is None:
            raise UserError(f"nothing to resume in {self.run_dir.path} (no readable config.json)")
        if _pinned(before) != _pinned(train_record(self.config)):
            raise UserError(f"{self.run_dir.path} was trained with other settings; resume it "
                            "with the same ones (only trainer.max_steps and "
                            "trainer.checkpoint_every may change)")

    def _prepare(self) -> None:
        """A new run dir, or a resumed one's config.json rewritten with what may change."""
        if self.resume:
            self.run_dir.rewrite(train_record(self.config))
        else:
            self.run_dir.prepare(train_record(self.config))

    async def run(self, on_step: Callable[[StepResult], Any] = lambda r: None,
                  ) -> list[StepResult]:
        from skyrl_agent.sandboxes.reaper import reap_leftovers

        await asyncio.to_thread(self._prepare)
        await asyncio.to_thread(reap_leftovers, self.config.sandbox)  # a killed run's sandboxes
        store = TrajectoryStore(self.run_dir.path, writable=True)
        backend = await asyncio.to_thread(make_backend, self.config)
        metrics = MetricsLog(self.run_dir.path)
        try:
            state = LoopState()
            latest = self.checkpoints.latest() if self.resume else None
            if latest is not None:
                state = await asyncio.to_thread(self.checkpoints.load, backend, latest)
                log.info("resumed from %s (step %d)", latest, state.step)
            async with model_sessions(self.config, self.run_dir.path) as model:
                if state.step:  # the servers start from the model's weights
                    await publish(backend, model.client, state.step)
                collector = Collector(self.config, self.agent_cls, store, model.sessions)

                def step_done(result: StepResult) -> None:
                    metrics.record(result)
                    on_step(result)

                async def checkpoint(loop_state: LoopState) -> None:
                    every = self.config.trainer.checkpoint_every
                    if loop_state.step % every == 0 or \
                            loop_state.step == self.config.trainer.max_steps:
                        await asyncio.to_thread(self.checkpoints.save, backend, loop_state)

                stream = TaskStream(self.tasks, self.config.collector.n_samples_per_task,
                                    self.config.seed)
                loop = AsyncLoop(self.config, backend, collector, model.client, stream, state,
                                 step_done, checkpoint)
                try:
                    return await supervised(loop.run(), model.server)
                finally:
                    await collector.close()
        finally:
            metrics.close()
            backend.close()
            store.close()


def export_latest(config: RunConfig, run_dir: Path, target: Path) -> Path:
    """The newest checkpoint of a training run as a model folder the server loads."""
    latest = Checkpoints(run_dir).latest()
    if latest is None:
        raise UserError(f"{run_dir} holds no complete checkpoint to export")
    backend = make_backend(config)
    try:
        Checkpoints(run_dir).load(backend, latest)
        backend.export(target)
    finally:
        backend.close()
    return target
