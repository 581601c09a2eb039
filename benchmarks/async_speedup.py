"""Synchronous vs asynchronous training on a long-tailed workload, side by side in one run.

The same number of trajectories is trained in every configuration: trainer.max_steps steps of
groups_per_step groups x 8 samples. Everything is real (the embedded server on a tiny random
char-level model, the collector with local sandboxes and separate-mode verification, the torch
trainer, weight sync) except the agent: `lognormal-answer` first waits a lognormal time (median
--median s, shape --sigma, capped at 30 s; drawn from the sample's own seed, so a given (task,
sample index) waits as long in every configuration), then asks the model once and writes the
reply for the toy task's tests (toy/eight-a: the share of a's among the reply's first 8 letters).

Configurations, each a fresh TrainJob in its own run dir, run back to back in this process:
max_staleness 0 (synchronous, the reference loop) and 1, 2, 4 (asynchronous). Per configuration:
wall-clock of TrainJob.run (server start and stop included) and of the training itself (the
first agent start to the last step's end), each with its ratio to the synchronous one; the
share of CPU time busy over the run (/proc/stat, all cores; the machine is shared); mean
trainer_idle (the share of each step spent waiting for groups); trajectories stored (sampled)
vs trained; groups dropped as too stale; the largest staleness trained; the final reward as the
steps saw it (mean of the last 2 steps' reward_mean: samples of versions up to max_staleness
behind) and of the final weights (the last checkpoint exported, --eval fresh samples of the
plain answer agent with another seed). collector.max_concurrent_sandboxes is (4 + 1) x
groups_per_step x 8 everywhere, so it never caps the admission window of max_staleness 4.
The latency floor of the synchronous run is the sum over steps of the longest wait of the step.
Target (the issue, after AReaL's 2.77x): >= 2.5x with no reward loss.

With --repeats R every configuration runs R times, repeat r with run seed r (so its sampling
and its agents' waits differ between repeats and are equal across configurations), and a second
table gives each configuration's mean and spread over the repeats.

--time-to-accuracy: every step's weights are kept (a checkpoint per step, copied aside as the
run goes) and, once the run is over, each is scored on --eval fresh samples (seed 1, held out).
With the same steps everywhere an asynchronous run cannot reach the synchronous best when its
steps learn less each; --async-steps gives the asynchronous runs more steps to get there.
Per seed the target is the synchronous run's best held-out reward; each configuration's time to
accuracy is the training time (from the first agent start) at the end of the first step whose
weights score at least that. Target (the issue): staleness <= 4 reaches it >= 2x sooner at
--median 3, with the final held-out reward within the seeds' spread.

Run: .venv/bin/python benchmarks/async_speedup.py [--steps 8] [--median 1] [--sigma 1]
     [--eval 64] [--staleness 0 1 2 4] [--repeats 1] [--time-to-accuracy]
     (about 8 minutes on 2 cores; --median 3 about 11; time to accuracy adds the scoring of
     every step's weights)
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.tiny_models

from skyrl_agent import plugins
from skyrl_agent.agents.answer import AnswerAgent
from skyrl_agent.backends.build import make_backend
from skyrl_agent.collector.one_sample import sample_seed
from skyrl_agent.config import RunConfig, load_config
from skyrl_agent.data.store import TrajectoryStore
from skyrl_agent.envs.env import Env
from skyrl_agent.jobs.rollout import Rollout
from skyrl_agent.jobs.train import TrainJob
from skyrl_agent.llm.session import LLMSession
from skyrl_agent.rl.checkpoints import Checkpoints
from skyrl_agent.rl.step import StepResult
from skyrl_agent.types import FinishReason
from tests.tiny_models import char_model_dir

STALENESS = (0, 1, 2, 4)
RESULTS_TTA = Path(__file__).parent / "results" / "time_to_accuracy.md"
N = 8
TASK = "toy/eight-a"
MAX_WAIT_S = 30.0  # well inside the toy task's 60 s agent timeout


class LognormalAnswerAgent(AnswerAgent):
    """AnswerAgent after a lognormal wait: a long-tailed stand-in for multi-turn agent work."""

    name = "lognormal-answer"
    median_s: ClassVar[float] = 1.0
    sigma: ClassVar[float] = 1.0
    first_start: ClassVar[float | None] = None
    """perf_counter() when the first agent of the current configuration started."""
    _fallback: ClassVar[random.Random] = random.Random(0)

    @classmethod
    def wait_s(cls, seed: int | None) -> float:
        rng = cls._fallback if seed is None else random.Random(f"latency/{seed}")
        return min(cls.median_s * rng.lognormvariate(0.0, cls.sigma), MAX_WAIT_S)

    async def act(self, env: Env, llm: LLMSession) -> FinishReason:
        cls = type(self)
        if cls.first_start is None:
            cls.first_start = time.perf_counter()
        await asyncio.sleep(cls.wait_s(llm.seed))  # the sample's seed: same wait in every run
        return await super().act(env, llm)


@dataclass
class Outcome:
    staleness: int
    wall_s: float
    loop_s: float
    busy: float
    idle: float
    train_s: float
    sampled: int
    trained: int
    masked: int
    dropped: int
    staleness_max: int
    final_reward: float
    eval_reward: float
    rewards: list[float]
    seed: int = 0
    step_s: list[float] = field(default_factory=list)
    """Training seconds (from the first agent start) at the end of each step."""
    heldout: list[float] = field(default_factory=list)
    """Held-out reward of each step's weights (--time-to-accuracy)."""


def load_line(label: str) -> str:
    one, five, _ = os.getloadavg()
    return f"{label}: load average {one:.1f} (1 min), {five:.1f} (5 min)"


def cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def sync_floor(args: argparse.Namespace, seed: int = 0) -> float:
    """Seconds the synchronous run waits on agents alone: each step's longest wait."""
    per_step = args.groups_per_step * N
    waits = [LognormalAnswerAgent.wait_s(sample_seed(seed, TASK, i))
             for i in range(args.steps * per_step)]
    return sum(max(waits[s:s + per_step]) for s in range(0, len(waits), per_step))


def final_policy_reward(config: RunConfig, run_dir: Path, samples: int) -> float:
    """Mean reward of fresh samples from the last checkpoint's weights (seed 1: unseen)."""
    latest = Checkpoints(run_dir).latest()
    assert latest is not None
    return policy_reward(config, latest, run_dir / "final", samples)


def policy_reward(config: RunConfig, checkpoint: Path, out: Path, samples: int) -> float:
    """Mean reward of fresh samples (seed 1: held out) from a checkpoint's weights, served by
    the embedded server with the plain answer agent; `out` holds the export and the samples."""
    backend = make_backend(config)
    try:
        Checkpoints(checkpoint.parent).load(backend, checkpoint)
        backend.export(out / "model")
    finally:
        backend.close()
    settings = config.model_copy(update={
        "agent": config.agent.model_copy(update={"name": "answer"}),
        "inference": config.inference.model_copy(update={"model": str(out / "model")}),
        "seed": 1})
    job = Rollout(settings, samples, out / "eval")
    try:
        result = asyncio.run(job.run(lambda trajectory: None))
    finally:
        job.close()
    rewards = [t.reward.value for t in result.trajectories if not t.masked]
    return statistics.mean(rewards) if rewards else float("nan")


def one_configuration(staleness: int, model: Path, work_root: Path, run_dir: Path,
                      args: argparse.Namespace, seed: int = 0) -> Outcome:
    window = (max(args.staleness) + 1) * args.groups_per_step * N
    steps = args.steps if staleness == 0 else args.async_steps or args.steps
    config = load_config(None, [f"seed={seed}",
        "agent.name=lognormal-answer", "tasks.source=toy", f"inference.model={model}",
        "inference.max_tokens=8", f"collector.n_samples_per_task={N}",
        f"collector.max_concurrent_sandboxes={window}",
        "trainer.learning_rate=3e-2", f"trainer.groups_per_step={args.groups_per_step}",
        f"trainer.max_steps={steps}",
        f"trainer.checkpoint_every={1 if args.time_to_accuracy else steps}",
        f"trainer.max_staleness={staleness}", f"sandbox.work_root={work_root}"])
    LognormalAnswerAgent.first_start = None
    step_ends: list[float] = []
    kept = run_dir.parent / f"{run_dir.name}-steps"

    def step_done(result: StepResult) -> None:
        step_ends.append(time.perf_counter())
        if args.time_to_accuracy:
            keep_checkpoints(run_dir, kept)

    busy_before, total_before = cpu_times()
    started = time.perf_counter()
    results: list[StepResult] = asyncio.run(TrainJob(config, run_dir).run(step_done))
    wall = time.perf_counter() - started
    busy_after, total_after = cpu_times()
    first = LognormalAnswerAgent.first_start or started
    metrics = [r.metrics for r in results]
    stored = TrajectoryStore(run_dir).load().trajectories
    heldout: list[float] = []
    if args.time_to_accuracy:  # scored after the run: not part of its time
        keep_checkpoints(run_dir, kept)
        heldout = [policy_reward(config, step, kept / f"eval-{step.name}", args.eval)
                   for step in sorted(kept.glob("step-*"))]
        eval_reward = heldout[-1]
    else:
        eval_reward = (final_policy_reward(config, run_dir, args.eval) if args.eval
                       else float("nan"))
    return Outcome(
        staleness=staleness, seed=seed, wall_s=wall, loop_s=step_ends[-1] - first,
        busy=(busy_after - busy_before) / max(total_after - total_before, 1),
        idle=statistics.mean(m["trainer_idle"] for m in metrics),
        train_s=sum(m["train_s"] + m["sync_s"] for m in metrics),
        sampled=len(stored),
        trained=int(sum(m["trajectories"] + m["masked"] for m in metrics)),
        masked=int(sum(m["masked"] for m in metrics)),
        dropped=int(sum(m["dropped_stale"] for m in metrics)),
        staleness_max=int(max(m["staleness_max"] for m in metrics)),
        final_reward=statistics.mean(r.reward_mean for r in results[-2:]),
        eval_reward=eval_reward, rewards=[r.reward_mean for r in results],
        step_s=[end - first for end in step_ends], heldout=heldout)


def keep_checkpoints(run_dir: Path, kept: Path) -> None:
    """Copy aside every complete checkpoint not copied yet (the run keeps only its newest)."""
    for checkpoint in Checkpoints(run_dir).complete():
        if not (kept / checkpoint.name).exists():
            shutil.copytree(checkpoint, kept / checkpoint.name)


def time_to(outcome: Outcome, target: float) -> float | None:
    """Training seconds until the first step whose weights score at least `target`."""
    reached = [t for t, reward in zip(outcome.step_s, outcome.heldout, strict=True)
               if reward >= target]
    return reached[0] if reached else None


def accuracy_table(outcomes: Sequence[Outcome]) -> str:
    """Per run: time to the synchronous run's best held-out reward (same seed), its ratio."""
    sync = {o.seed: o for o in outcomes if o.staleness == 0}
    lines = ["| max_staleness | seed | sync best held-out | time to it s | x sync | "
             "held-out per step | final held-out |", "|---|---:|---:|---:|---:|---|---:|"]
    for o in outcomes:
        target = max(sync[o.seed].heldout)
        reached, base = time_to(o, target), time_to(sync[o.seed], target)
        ratio = f"{base / reached:.2f}" if reached and base else "not reached"
        lines.append(f"| {o.staleness} | {o.seed} | {target:.3f} | "
                     f"{'-' if reached is None else f'{reached:.1f}'} | {ratio} | "
                     f"{' '.join(f'{r:.2f}' for r in o.heldout)} | {o.heldout[-1]:.3f} |")
    return "\n".join(lines)


def accuracy_summary(outcomes: Sequence[Outcome]) -> str:
    """Per configuration over the seeds: speed-up to the synchronous best, final held-out."""
    sync = {o.seed: o for o in outcomes if o.staleness == 0}
    lines = ["| max_staleness | seeds | reached | time to sync best x sync | final held-out |",
             "|---|---:|---:|---:|---:|"]
    for staleness in dict.fromkeys(o.staleness for o in outcomes):
        runs = [o for o in outcomes if o.staleness == staleness]
        ratios = []
        for o in runs:
            target = max(sync[o.seed].heldout)
            reached, base = time_to(o, target), time_to(sync[o.seed], target)
            if reached and base:
                ratios.append(base / reached)
        lines.append(f"| {staleness} | {len(runs)} | {len(ratios)} | {spread(ratios)} | "
                     f"{spread([o.heldout[-1] for o in runs])} |")
    return "\n".join(lines)


def table(outcomes: Sequence[Outcome]) -> str:
    """One row per run; ratios against the synchronous run of the same seed."""
    sync = {o.seed: o for o in outcomes if o.staleness == 0}
    lines = ["| max_staleness | seed | wall s | x sync | training s | x sync | CPU busy | "
             "trainer idle | train+sync s | sampled | trained | masked | dropped groups | "
             "staleness max | reward, last 2 steps | reward, final weights |",
             "|---|---:|" + "---:|" * 14]
    for o in outcomes:
        base = sync.get(o.seed, o)
        name = f"{o.staleness} (sync)" if o.staleness == 0 else str(o.staleness)
        lines.append(
            f"| {name} | {o.seed} | {o.wall_s:.1f} | {base.wall_s / o.wall_s:.2f} | "
            f"{o.loop_s:.1f} | {base.loop_s / o.loop_s:.2f} | {100 * o.busy:.0f}% | "
            f"{100 * o.idle:.1f}% | {o.train_s:.2f} | {o.sampled} | {o.trained} | {o.masked} | "
            f"{o.dropped} | {o.staleness_max} | {o.final_reward:.3f} | {o.eval_reward:.3f} |")
    return "\n".join(lines)


def spread(values: Sequence[float]) -> str:
    values = [v for v in values if not math.isnan(v)]  # --eval 0 measured none
    if len(values) < 2:
        return f"{values[0]:.2f}" if values else "-"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def summary(outcomes: Sequence[Outcome]) -> str:
    """Per configuration over its repeats: mean ± standard deviation."""
    sync = {o.seed: o for o in outcomes if o.staleness == 0}
    lines = ["| max_staleness | repeats | wall x sync | training x sync | reward, final weights |",
             "|---|---:|---:|---:|---:|"]
    for staleness in dict.fromkeys(o.staleness for o in outcomes):
        runs = [o for o in outcomes if o.staleness == staleness and o.seed in sync]
        lines.append(
            f"| {staleness} | {len(runs)} | "
            f"{spread([sync[o.seed].wall_s / o.wall_s for o in runs])} | "
            f"{spread([sync[o.seed].loop_s / o.loop_s for o in runs])} | "
            f"{spread([o.eval_reward for o in runs])} |")
    return "\n".join(lines)


def commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=False, cwd=Path(__file__).parent)
    return done.stdout.strip() or "unknown"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="trainer.max_steps (all runs)")
    parser.add_argument("--groups-per-step", type=int, default=4)
    parser.add_argument("--median", type=float, default=1.0, help="median agent wait, seconds")
    parser.add_argument("--sigma", type=float, default=1.0, help="lognormal shape")
    parser.add_argument("--eval", type=int, default=64,
                        help="fresh samples of the final weights per configuration (0: skip)")
    parser.add_argument("--staleness", type=int, nargs="+", default=list(STALENESS),
                        help="max_staleness values; 0 (synchronous) is always run first")
    parser.add_argument("--repeats", type=int, default=1, help="runs per configuration")
    parser.add_argument("--time-to-accuracy", action="store_true",
                        help="score every step's weights; time to the synchronous best")
    parser.add_argument("--async-steps", type=int, default=None,
                        help="trainer.max_steps of the asynchronous runs (default: --steps); "
                             "more lets them go on learning past the synchronous run's steps")
    args = parser.parse_args(argv)
    if args.time_to_accuracy and not args.eval:
        parser.error("--time-to-accuracy scores weights on --eval samples: give --eval > 0")
    LognormalAnswerAgent.median_s, LognormalAnswerAgent.sigma = args.median, args.sigma
    plugins.register(plugins.AGENTS, LognormalAnswerAgent.name, LognormalAnswerAgent)

    print(f"commit {commit()}, {os.cpu_count()} cores; {args.steps} steps x "
          f"{args.groups_per_step} groups x {N} samples = "
          f"{args.steps * args.groups_per_step * N} trajectories trained per configuration; "
          f"waits lognormal(median {args.median:g} s, sigma {args.sigma:g}); synchronous "
          f"latency floor {sync_floor(args):.1f} s (seed 0)")
    args.staleness = [0, *(s for s in args.staleness if s != 0)]
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="skyrl-bench-async-") as temp:
        base = Path(temp)
        base.chmod(0o755)  # the unprivileged sandbox user must reach work_root
        work_root = base / "sandboxes"
        work_root.mkdir(mode=0o755)
        model = char_model_dir(base / "model")
        for seed in range(args.repeats):
            for staleness in args.staleness:
                print(load_line(f"seed {seed}, max_staleness {staleness}, before"), flush=True)
                outcome = one_configuration(staleness, model, work_root,
                                            base / f"run-{seed}-{staleness}", args, seed)
                outcomes.append(outcome)
            print(f"  {outcome.wall_s:.1f} s, training {outcome.loop_s:.1f} s; rewards per step: "
                  + " ".join(f"{r:.2f}" for r in outcome.rewards), flush=True)
        print(load_line("after all"))
    print()
    print(table(outcomes))
    if args.repeats > 1:
        print()
        print(summary(outcomes))
    if args.time_to_accuracy:
        command = " ".join(["benchmarks/async_speedup.py", *(argv or sys.argv[1:])])
        lines = ["# Time to accuracy: asynchronous vs synchronous training", "",
                 f"`{command}` (commit {commit()}, {os.cpu_count()} cores). Every step's weights "
                 f"scored on {args.eval} held-out samples after its run; per seed, the time "
                 "(training seconds from the first agent start to the end of a step) until a "
                 "step's weights reach the synchronous run's best held-out reward.", "",
                 accuracy_table(outcomes), "", accuracy_summary(outcomes), "",
                 "All runs:", "", table(outcomes), ""]
        RESULTS_TTA.write_text("\n".join(lines))
        print()
        print("\n".join(lines[4:7]))


if __name__ == "__main__":
    main()
