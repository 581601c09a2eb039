"""A training run: validated before any work, resumable from its run dir.

    RUN_DIR/config.json      the settings (a resumed run must use the same)
    RUN_DIR/trajectories/    every sampled trajectory (the store)
    RUN_DIR/checkpoints/     the newest checkpoints (weights, optimizer, RNG, loop state)
    RUN_DIR/metrics.jsonl    per-step metrics; RUN_DIR/tensorboard/ the same for TensorBoard
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from skyrl_agent.backends.build import describe_backend, make_backend
from skyrl_agent.config import TRAIN_DEFAULTS, RunConfig, config_from, load_config
from skyrl_agent.data.run_dir import RunDir, RunRecord
from skyrl_agent.errors import UserError
from skyrl_agent.jobs.checks import check_trainable
from skyrl_agent.jobs.placement import local_workers
from skyrl_agent.jobs.prepare import REFERENCE, TRAIN, prepare_run, record_of, train_record
from skyrl_agent.rl.checkpoints import Checkpoints, LoopState
from skyrl_agent.rl.estimate import estimate_step, remember
from skyrl_agent.rl.loop import AsyncLoop
from skyrl_agent.rl.metrics import MetricsLog
from skyrl_agent.rl.reference_loop import reference_loop
from skyrl_agent.rl.step import StepResult, publish
from skyrl_agent.rl.stream import TaskStream
from skyrl_agent.rl.workers import Placement, Workers
from skyrl_agent.tasks.spec import TaskSpec, impossible_twin

log = logging.getLogger(__name__)


RESUMABLE_CHANGES = {"max_steps", "checkpoint_every", "wandb_project", "backend",
                     "data_parallel", "tensor_parallel"}
"""Trainer settings a resumed run may change: how long it goes on, how often it saves, where
else it reports, and which backend over how many ranks (every backend reads every backend's
checkpoints)."""


def train_settings(config_file: Path | None, overrides: list[str] | None,
                   options: Mapping[str, Any], resume: bool) -> RunConfig:
    """The run's settings from `train`'s command line: `options` are its typed options
    (`section.key` -> value, None where not given). A resumed run starts from its own stored
    settings, which the options given now must agree with; a new one from `TRAIN_DEFAULTS`,
    the file, the options and the overrides."""
    output = options.get("output_dir")
    if resume:
        if output is None:
            raise UserError("--resume needs the run's --output RUN_DIR")
        record = RunDir(Path(output)).record()
        if record is None:
            raise UserError(f"nothing to resume in {output} (no readable config.json)")
        return config_from({**record.config, "collector": {"n_samples_per_task": record.n}},
                           overrides, options)
    if output is None:
        options = {**options, "output_dir": Path("runs") / time.strftime("train-%Y%m%d-%H%M%S")}
    return load_config(config_file, overrides, options, defaults=TRAIN_DEFAULTS)


def placement_of(config: RunConfig) -> Placement | None:
    """Ray actors when the run names a Ray address; None: every part in this process."""
    if not config.ray.address:
        return None
    from skyrl_agent.distributed import ray_placement

    return ray_placement()


def _pinned(record: RunRecord) -> RunRecord:
    trainer = {k: v for k, v in (record.section("trainer") or {}).items()
               if k not in RESUMABLE_CHANGES}
    return RunRecord(record.n, {**record.config, "trainer": trainer})


class TrainJob:
    """One training run. Construction validates everything and prepares the run dir."""

    def __init__(self, config: RunConfig, output: Path, resume: bool = False,
                 placement: Placement | None = None) -> None:
        from skyrl_agent.model.names import resolve_model

        check_trainable(config)
        if config.trainer.wandb_project and importlib.util.find_spec("wandb") is None:
            raise UserError("trainer.wandb_project needs W&B: pip install 'skyrl-agent[wandb]'")
        self.model_folder = resolve_model(config.inference.model)
        prepared = prepare_run(config, TRAIN)  # its run dir is checked and written below
        self.config = config
        self.run_dir = RunDir(output)
        self.agent_cls = prepared.agent
        self.tasks: list[TaskSpec] = list(prepared.tasks)
        if config.tasks.impossible_twins and not any(map(impossible_twin, self.tasks)):
            raise UserError(f"tasks.impossible_twins needs tasks that can have an impossible "
                            f"twin (SWE-format tasks whose tests run under pytest); none of the "
                            f"{len(self.tasks)} tasks of {config.tasks.source} can")
        self.checkpoints = Checkpoints(output)
        self.resume = resume
        self.placement: Placement = placement or local_workers
        """Where the run's parts work: this process, or Ray actors (skyrl_agent.distributed)."""
        if self.run_dir.config_file.exists() and not resume:
            raise UserError(f"{output} already holds a training run: add --resume to continue "
                            "it, or choose another --output")
        if resume:
            self._check_resumable()

    @property
    def samples_per_step(self) -> int:
        """Samples one step trains: groups (or every task) x samples per task."""
        return ((self.config.trainer.groups_per_step or len(self.tasks))
                * self.config.collector.n_samples_per_task)

    def plan(self, calibrate: bool = False) -> str:
        """What the run will do, in a few lines; with `calibrate` (`train --dry-run`), a step's
        time is measured when no earlier run here measured it."""
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
            + (f", LoRA rank {trainer.lora_rank}" if trainer.lora_rank else ", full fine-tune")
            + f"; {describe_backend(trainer)}",
            f"max staleness {trainer.max_staleness}; checkpoint every "
            f"{trainer.checkpoint_every} steps into {self.run_dir.checkpoints}",
            f"resume from {latest}" if latest else "starting from the model's weights",
            self._where(),
            *estimate_step(self.config, self.model_folder, self.samples_per_step,
                           calibrate).lines(),
        ])

    def _where(self) -> str:
        servers = "an endpoint" if self.config.inference.endpoint else \
            f"{self.config.inference.num_servers} {self.config.inference.engine} server(s)"
        ray = self.config.ray
        if ray.address is None:
            return f"one process: {servers}"
        return (f"Ray ({ray.address}): {ray.collectors} collector actors, {servers}, "
                f"trainer reserving {ray.trainer_cpus:g} CPUs")

    def _check_resumable(self) -> None:
        before = self.run_dir.record()
        if before is None:
            raise UserError(f"nothing to resume in {self.run_dir.path} (no readable config.json)")
        if _pinned(before) != _pinned(train_record(self.config)):
            changeable = ", ".join(f"trainer.{name}" for name in sorted(RESUMABLE_CHANGES))
            raise UserError(f"{self.run_dir.path} was trained with other settings; resume it "
                            f"with the same ones (only {changeable} may change)")

    def _prepare(self) -> None:
        """A new run dir, or a resumed one's config.json rewritten with what may change."""
        if self.resume:
            self.run_dir.rewrite(train_record(self.config))
        else:
            self.run_dir.prepare(train_record(self.config))

    async def run(self, on_step: Callable[[StepResult], Any] = lambda r: None,
                  ) -> list[StepResult]:
        """Train to trainer.max_steps (or on from the last checkpoint when resuming). The run
        dir is written only once every part has started."""
        self.run_dir.path.mkdir(parents=True, exist_ok=True)  # for the servers' logs
        async with self.placement(self.config, self.run_dir.path, self.agent_cls) as workers:
            await asyncio.to_thread(self._prepare)
            metrics = MetricsLog(self.run_dir.path, self.config.trainer.wandb_project,
                                 train_record(self.config).config)
            try:
                return await self._train(workers, metrics, on_step)
            finally:
                metrics.close()

    async def _train(self, workers: Workers, metrics: MetricsLog,
                     on_step: Callable[[StepResult], Any]) -> list[StepResult]:
        state = LoopState()
        latest = self.checkpoints.latest() if self.resume else None
        if latest is not None:
            state = await asyncio.to_thread(self.checkpoints.load, workers.backend, latest)
            log.info("resumed from %s (step %d)", latest, state.step)
        if state.step:  # the servers start from the model's weights
            await publish(workers.backend, workers.servers, state.step)

        def step_done(result: StepResult) -> None:
            metrics.record(result)
            remember(self.config, self.model_folder, result.metrics, self.samples_per_step,
                     f"measured by {self.run_dir.path.name}, step {result.step}")
            on_step(result)

        async def checkpoint(loop_state: LoopState) -> None:
            every = self.config.trainer.checkpoint_every
            if loop_state.step % every == 0 or loop_state.step == self.config.trainer.max_steps:
                await asyncio.to_thread(self.checkpoints.save, workers.backend, loop_state)

        stream = TaskStream(self.tasks, self.config.collector.n_samples_per_task,
                            self.config.seed, self.config.tasks.impossible_twins)
        loop = AsyncLoop(self.config, workers.backend, workers.collector, workers.servers,
                         stream, state, step_done, checkpoint)
        results: list[StepResult] = await workers.supervise(loop.run())
        return results


async def reference_run(config: RunConfig, output: Path,
                        on_step: Callable[[StepResult], Any] = lambda r: None,
                        ) -> list[StepResult]:
    """The reference loop in one sitting, every part in this process; its run dir pins what is
    sampled, like a rollout's (`eval RUN_DIR` reads it)."""
    check_trainable(config)
    prepared = await asyncio.to_thread(
        prepare_run, config, REFERENCE, output,
        record_of(config, config.collector.n_samples_per_task))
    async with local_workers(config, output, prepared.agent) as workers:
        return await reference_loop(config, workers, prepared.tasks, on_step)


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
