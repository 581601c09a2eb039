"""The warm-start recipe: demonstrations on training seeds -> sft -> RL on training seeds ->
held-out evaluation of every model. Each stage keeps its own run dir under one folder:

    OUT/demos/       the demonstrations (`skyrl-agent demos`)
    OUT/sft-model/   the fine-tuned model (`skyrl-agent sft --data OUT/demos`)
    OUT/train/       the RL run from the fine-tuned model (`skyrl-agent train`)
    OUT/rl-model/    the RL run's last checkpoint as a model folder
    OUT/eval-base/, OUT/eval-sft/, OUT/eval-rl/   held-out rollouts of each model

A stage whose output is complete is skipped, so the same command resumes. Training stages see
only the training split of the task families; held-out seeds reach the evaluations alone (the
trainers refuse them besides).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from skyrl_agent.atomic import atomic_folder
from skyrl_agent.config import RunConfig, with_values
from skyrl_agent.data.store import TrajectoryStore
from skyrl_agent.jobs.demos import DemoJob
from skyrl_agent.jobs.rollout import Rollout
from skyrl_agent.jobs.train import TrainJob, export_latest
from skyrl_agent.rl.checkpoints import Checkpoints
from skyrl_agent.rl.metrics import read_metrics
from skyrl_agent.rl.sft import SftPlan, plan_sft, run_sft
from skyrl_agent.stopping import run_until_stopped
from skyrl_agent.tasks.generated import parse_ref

MODELS = ("base", "sft", "rl")
"""The models a recipe evaluates, in order."""
RL_CHECKPOINT_EVERY = 2
"""RL steps between checkpoints (and always the last): a killed RL stage resumes losing at most
this many steps (an RL step takes minutes on 2 cores)."""


@dataclass(frozen=True)
class RecipeSettings:
    """The recipe's knobs; everything else comes from the run config (budgets, sandbox, seed)."""

    families: str = "write-file,count,sort-lines,replace-text"
    """Generated families (a `gen:` FAMILY part: names, NAME@DIFFICULTY, all)."""
    train_seeds: int = 12
    """Training seeds per family: demonstrations and RL tasks."""
    heldout_seeds: int = 4
    """Held-out seeds per family: the evaluation tasks."""
    sft_epochs: int = 2
    sft_batch_size: int = 8
    sft_learning_rate: float = 5e-5
    rl_steps: int = 4
    rl_learning_rate: float = 1e-5
    group_size: int = 4
    """RL samples per task (the group GRPO compares)."""
    groups_per_step: int = 4
    eval_samples: int = 2
    """Samples per held-out task for each evaluated model."""
    rl_seeds: int = 0
    """Training seeds per family RL samples from, counted from the same first seed (0: the
    demonstrations' `train_seeds`). More gives RL tasks the warm start never saw: on the ones it
    memorized nearly every group passes whole, and a uniform group teaches GRPO nothing."""

    @property
    def train_source(self) -> str:
        return f"gen:{self.families}:train:{self.train_seeds}"

    @property
    def rl_source(self) -> str:
        return f"gen:{self.families}:train:{self.rl_seeds or self.train_seeds}"

    @property
    def heldout_source(self) -> str:
        return f"gen:{self.families}:heldout:{self.heldout_seeds}"

    def check(self) -> None:
        """Bad families or seed counts fail here, with one line, before any stage runs."""
        for source in (self.train_source, self.rl_source, self.heldout_source):
            parse_ref(source.removeprefix("gen:"))


@dataclass(frozen=True)
class Score:
    """A held-out evaluation's result."""

    pass_rate: float
    """Share of unmasked samples with reward 1."""
    samples: int
    """Unmasked samples."""
    masked: int


def score(run_dir: Path) -> Score:
    trajectories = TrajectoryStore(run_dir).load().trajectories
    kept = [t for t in trajectories if not t.masked]
    passed = sum(t.reward.value >= 1.0 for t in kept)
    return Score(passed / max(len(kept), 1), len(kept), len(trajectories) - len(kept))


def demos_job(config: RunConfig, source: str, output: Path) -> DemoJob:
    return DemoJob(with_values(config, {"tasks.source": source, "output_dir": output}),
                   output)


def sft_plan(config: RunConfig, settings: RecipeSettings, demos: Path) -> tuple[RunConfig, SftPlan]:
    sft_config = with_values(config, {"trainer.learning_rate": settings.sft_learning_rate})
    return sft_config, plan_sft(sft_config, demos, None, settings.sft_epochs,
                                settings.sft_batch_size)


def rl_job(config: RunConfig, settings: RecipeSettings, model: Path, output: Path) -> TrainJob:
    """The RL run from `model` on the training split; resumed when it was started before."""
    rl_config = with_values(config, {
        "inference.model": str(model), "tasks.source": settings.rl_source,
        "collector.n_samples_per_task": settings.group_size,
        "trainer.groups_per_step": settings.groups_per_step,
        "trainer.max_steps": settings.rl_steps, "trainer.checkpoint_every": RL_CHECKPOINT_EVERY,
        "trainer.learning_rate": settings.rl_learning_rate, "output_dir": output})
    return TrainJob(rl_config, output, resume=(output / "config.json").exists())


def rl_done(output: Path, settings: RecipeSettings) -> bool:
    latest = Checkpoints(output).latest()
    return latest is not None and latest.name == f"step-{settings.rl_steps:06d}"


def export_rl(job: TrainJob, target: Path) -> Path:
    """The RL run's last checkpoint as a model folder, written whole or not at all."""
    return atomically(target, lambda staging: export_latest(job.config, job.run_dir.path,
                                                            staging))


def atomically(target: Path, write: Callable[[Path], object]) -> Path:
    """`write` a folder through skyrl_agent.atomic: a crash never leaves a half-written model
    where a later stage would take it for finished. The newest write wins."""
    with atomic_folder(target, replace=True) as staging:
        write(staging)
    return target


def eval_job(config: RunConfig, settings: RecipeSettings, model: str, output: Path) -> Rollout:
    """Held-out rollouts of `model` (resumable like any rollout)."""
    eval_config = with_values(config, {"inference.model": model,
                                       "tasks.source": settings.heldout_source,
                                       "output_dir": output})
    return Rollout(eval_config, settings.eval_samples, output)


@dataclass(frozen=True)
class Layout:
    """Where a recipe's stages keep their run dirs."""

    root: Path

    @property
    def demos(self) -> Path:
        return self.root / "demos"

    @property
    def sft_model(self) -> Path:
        return self.root / "sft-model"

    @property
    def train(self) -> Path:
        return self.root / "train"

    @property
    def rl_model(self) -> Path:
        return self.root / "rl-model"

    @property
    def log(self) -> Path:
        return self.root / "recipe.log"

    def eval(self, model: str) -> Path:
        return self.root / f"eval-{model}"

    def model(self, name: str, base: str) -> str:
        return {"base": base, "sft": str(self.sft_model), "rl": str(self.rl_model)}[name]

    def write_summary(self, settings: RecipeSettings, scores: dict[str, Score],
                      seconds: dict[str, float]) -> Path:
        path = self.root / "summary.json"
        path.write_text(json.dumps({"settings": asdict(settings),
                                    "scores": {k: asdict(v) for k, v in scores.items()},
                                    "seconds": seconds}, indent=2))
        return path


def sft_stage(config: RunConfig, settings: RecipeSettings, demos: Path, target: Path,
              ) -> list[float]:
    """Fine-tune on the demonstrations into `target`; the loss of every step."""
    sft_config, plan = sft_plan(config, settings, demos)
    steps: list[float] = []
    atomically(target, lambda staging: run_sft(
        sft_config, plan, staging, settings.sft_epochs, settings.sft_batch_size,
        lambda step: steps.append(step.loss)))
    return steps


def rl_stage(config: RunConfig, settings: RecipeSettings, model: Path, output: Path,
             target: Path) -> list[float]:
    """RL from `model` (resumed if it was started), then its last checkpoint exported to
    `target`; the mean reward of every step."""
    job = rl_job(config, settings, model, output)
    if not rl_done(output, settings):
        run_until_stopped(job.run)
    if not model_done(target):
        export_rl(job, target)
    return [float(row["reward_mean"]) for row in read_metrics(output)]


def model_done(folder: Path) -> bool:
    """A model folder in place (stages write theirs with `atomically`)."""
    return (folder / "config.json").is_file()
