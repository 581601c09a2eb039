"""Does training make the agent better? Held-out pass rate of the base model, after the warm
start (SFT on demonstrations) and after K RL steps, for several seeds, side by side.

Everything is the real pipeline (`skyrl_agent/jobs/recipe.py`, what `skyrl-agent recipe`
runs): Terminus with the bundled SmolLM2-135M on the embedded CPU server, generated task
families in local sandboxes, separate-mode verification, the torch trainer.

1. demonstrations of the families' training seeds (`demos`), once;
2. SFT on them (`sft`), once: the warm start every seed starts from (training it per seed is the
   faithful version; on 2 shared cores it costs about 6 minutes each). The training stages
   run in child processes: a torch trainer's memory is only returned when its process ends;
3. per seed: held-out evaluation of the base and of the SFT model, `train` (RL with Dr. GRPO
   advantages) from the SFT model on the training seeds (`--rl-seeds`: by default three times
   the seeds the demonstrations cover, so most RL tasks are new to the warm start), its last
   checkpoint exported, and its held-out evaluation.
   The seed drives RL's sampling and shuffle and the evaluations' sampling.

Held-out tasks are the families' held-out seeds (never in demonstrations, SFT or RL data: the
trainers refuse them). Sampling is at temperature 1 everywhere, so the held-out pass rate is
pass@1 of the policy RL optimizes. Writes a markdown table and a PNG (`--results`), and prints
both verdicts: SFT above the base model, and RL above SFT by more than the seed-to-seed spread
(the larger of the SFT and RL ranges over seeds).

The default tasks are difficulty 2 of three families: there the warm start passes about half
of the held-out samples, so RL's groups of 8 are mostly mixed (at difficulty 1 SFT passes 0.87
and nearly every group passes whole, leaving GRPO nothing to compare).

Run: .venv/bin/python benchmarks/learning_curve.py [--seeds 0 1 2] [--rl-steps 8] ...
(about an hour a seed on 2 cores at the defaults, after a 12-minute warm start). Seeds may run
as separate processes (`--seeds 1` with its own `--output` holding copies of `demos/` and
`sft-model/`), but an RL stage's process holds about 11 GB: two at once do not fit in 24 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from skyrl_agent.config import RunConfig, load_config
from skyrl_agent.data.store import TrajectoryStore
from skyrl_agent.errors import RunStopped, UserError
from skyrl_agent.jobs.recipe import (
    RecipeSettings,
    Score,
    demos_job,
    eval_job,
    model_done,
    rl_stage,
    score,
    sft_stage,
)
from skyrl_agent.stopping import in_child, run_until_stopped, stop_on_sigterm
from skyrl_agent.tasks.families.base import TASK_NAME

RESULTS = Path(__file__).parent / "results"


@dataclass
class SeedRun:
    seed: int
    scores: dict[str, Score] = field(default_factory=dict)
    rl_rewards: list[float] = field(default_factory=list)
    """Training reward (mean over the step's samples) per RL step."""
    families: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)
    """Per model: passed and unmasked held-out samples of each task family."""


@dataclass
class Stage:
    """Wall-clock and load around one stage (the machine is shared: load says how much)."""

    seconds: float
    load_before: float
    load_after: float
    finished: bool = True
    """False for a stage stopped part-way: `seconds` is the work so far, and the pass that
    finishes the stage adds its own part."""


@dataclass
class Stages:
    """Every stage's wall-clock, kept in the output folder as each one ends or is stopped: a
    resumed stage reports the work of every pass, a skipped one not the moment it took to skip."""

    path: Path
    recorded: dict[str, Stage] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> Stages:
        stored = json.loads(path.read_text()) if path.exists() else {}
        return cls(path, {name: Stage(**stage) for name, stage in stored.items()})

    def record(self, name: str, stage: Stage) -> None:
        self.recorded[name] = stage
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({k: asdict(v) for k, v in self.recorded.items()}, indent=1))


def timed(stages: Stages, name: str, work):
    earlier = stages.recorded.get(name)
    if earlier is not None and earlier.finished:
        result = work()  # the stage finds its stored output and returns it
        print(f"  {name}: done in an earlier pass", flush=True)
        return result
    so_far, load = (earlier.seconds, earlier.load_before) if earlier else (0.0, os.getloadavg()[0])
    started, finished = time.monotonic(), False
    try:
        result = work()
        finished = True
    finally:  # a stopped stage keeps the part done: the pass that finishes it reports it all
        stages.record(name, Stage(so_far + time.monotonic() - started, load,
                                  os.getloadavg()[0], finished))
    print(f"  {name}: {stages.recorded[name].seconds:.0f} s (load {load:.1f} -> "
          f"{stages.recorded[name].load_after:.1f})", flush=True)
    return result


def run_job(job, *args):
    try:
        return run_until_stopped(lambda: job.run(*args))
    finally:
        job.close()


def warm_start(config: RunConfig, settings: RecipeSettings, root: Path,
               stages: Stages) -> Path:
    demos = root / "demos"
    timed(stages, "demos", lambda: run_job(demos_job(config, settings.train_source, demos)))
    model = root / "sft-model"
    if not model_done(model):
        losses = timed(stages, "sft", lambda: in_child(sft_stage, config, settings, demos, model,
                                                       log_file=root / "stages.log"))
        print(f"  sft: {len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}", flush=True)
    return model


def evaluate(config: RunConfig, settings: RecipeSettings, model: str, output: Path) -> Score:
    run_job(eval_job(config, settings, model, output), lambda t: None)
    return score(output)


def by_family(run_dir: Path) -> dict[str, tuple[int, int]]:
    """Passed and unmasked samples of each generated task family in a run."""
    counts: dict[str, tuple[int, int]] = {}
    for trajectory in TrajectoryStore(run_dir).load().trajectories:
        match = TASK_NAME.match(trajectory.task_id)
        if match is None or trajectory.masked:
            continue
        passed, samples = counts.get(match["family"], (0, 0))
        counts[match["family"]] = (passed + (trajectory.reward.value >= 1.0), samples + 1)
    return counts


def one_seed(config: RunConfig, settings: RecipeSettings, sft_model: Path, root: Path,
             seed: int, stages: Stages, base_samples: int) -> SeedRun:
    config = config.model_copy(update={"seed": seed})
    out = root / f"seed-{seed}"
    result = SeedRun(seed)
    base = config.inference.model
    base_settings = replace(settings, eval_samples=base_samples or settings.eval_samples)
    result.scores["base"] = timed(stages, f"seed {seed} eval base", lambda: evaluate(
        config, base_settings, base, out / "eval-base"))
    result.scores["sft"], result.rl_rewards, result.scores["rl"] = sft_then_rl(
        config, settings, sft_model, out, f"seed {seed}", stages)
    result.families = {m: by_family(out / f"eval-{m}") for m in result.scores}
    print(f"  seed {seed}: " + ", ".join(f"{k} {v.pass_rate:.3f}" for k, v in
                                         result.scores.items()), flush=True)
    return result


def sft_then_rl(config: RunConfig, settings: RecipeSettings, sft_model: Path, out: Path,
                label: str, stages: Stages) -> tuple[Score, list[float], Score]:
    """Held-out score of the SFT model, RL from it (in a child process; the training reward of
    every step), held-out score of the RL model: each a stage under `out`."""
    sft = timed(stages, f"{label} eval sft", lambda: evaluate(
        config, settings, str(sft_model), out / "eval-sft"))
    rl_model = out / "rl-model"
    rewards = timed(stages, f"{label} train + export", lambda: in_child(
        rl_stage, config, settings, sft_model, out / "train", rl_model,
        log_file=out.parent / "stages.log"))
    rl = timed(stages, f"{label} eval rl", lambda: evaluate(
        config, settings, str(rl_model), out / "eval-rl"))
    return sft, rewards, rl


def spread(values: list[float]) -> float:
    return max(values) - min(values) if values else 0.0


def verdicts(runs: list[SeedRun]) -> list[str]:
    means = {m: statistics.mean(r.scores[m].pass_rate for r in runs) for m in ("base", "sft", "rl")}
    spreads = {m: spread([r.scores[m].pass_rate for r in runs]) for m in ("sft", "rl")}
    gap = means["rl"] - means["sft"]
    worst = max(spreads.values())
    return [
        f"SFT above base: {'yes' if means['sft'] > means['base'] else 'NO'} "
        f"({means['sft']:.3f} vs {means['base']:.3f})",
        f"RL above SFT by more than the seed-to-seed spread: {'yes' if gap > worst else 'NO'} "
        f"(RL - SFT = {gap:+.3f}; spread over seeds: SFT {spreads['sft']:.3f}, "
        f"RL {spreads['rl']:.3f})"]


def table(runs: list[SeedRun]) -> list[str]:
    rows = ["| seed | base | SFT | RL | RL training reward by step | held-out samples "
            "(base/SFT/RL) | masked |", "|---|---:|---:|---:|---|---|---:|"]
    for r in runs:
        s = r.scores
        rows.append(f"| {r.seed} | {s['base'].pass_rate:.3f} | {s['sft'].pass_rate:.3f} | "
                    f"{s['rl'].pass_rate:.3f} | {' '.join(f'{x:.2f}' for x in r.rl_rewards)} | "
                    f"{s['base'].samples}/{s['sft'].samples}/{s['rl'].samples} | "
                    f"{sum(v.masked for v in s.values())} |")
    means = [statistics.mean(r.scores[m].pass_rate for r in runs) for m in ("base", "sft", "rl")]
    spreads = [spread([r.scores[m].pass_rate for r in runs]) for m in ("base", "sft", "rl")]
    rows.append(f"| mean | {means[0]:.3f} | {means[1]:.3f} | {means[2]:.3f} | | | |")
    rows.append(f"| spread (max - min) | {spreads[0]:.3f} | {spreads[1]:.3f} | {spreads[2]:.3f} "
                "| | | |")
    return rows


def family_table(runs: list[SeedRun]) -> list[str]:
    names = sorted({f for r in runs for counts in r.families.values() for f in counts})
    rows = ["| seed | model | " + " | ".join(names) + " |", "|---|---|" + "---:|" * len(names)]
    for r in runs:
        for model, counts in r.families.items():
            cells = [f"{counts[f][0]}/{counts[f][1]}" if f in counts else "-" for f in names]
            rows.append(f"| {r.seed} | {model} | " + " | ".join(cells) + " |")
    return rows


def plot(runs: list[SeedRun], path: Path, steps: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    labels = ["base", "SFT", f"RL ({steps} steps)"]
    for r in runs:
        left.plot(labels, [r.scores[m].pass_rate for m in ("base", "sft", "rl")], marker="o",
                  alpha=0.6, label=f"seed {r.seed}")
        right.plot(range(1, len(r.rl_rewards) + 1), r.rl_rewards, marker="o", alpha=0.6,
                   label=f"seed {r.seed}")
    means = [statistics.mean(r.scores[m].pass_rate for r in runs) for m in ("base", "sft", "rl")]
    left.plot(labels, means, color="black", linewidth=2.5, marker="s", label="mean")
    left.set(title="held-out pass rate (pass@1, T=1)", ylim=(-0.02, 1.02))
    right.set(title="RL: training reward per step", xlabel="step", ylim=(-0.02, 1.02))
    left.legend()
    right.legend()
    save_figure(figure, path)


def save_figure(figure, path: Path) -> None:
    import matplotlib.pyplot as plt

    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_results(args: argparse.Namespace, settings: RecipeSettings, runs: list[SeedRun],
                  stages: Stages) -> None:
    args.results.mkdir(parents=True, exist_ok=True)
    png = args.results / "learning_curve.png"
    plot(runs, png, settings.rl_steps)
    write_report(args.results / "learning_curve.md", args, settings, stages, [
        *table(runs), "", *verdicts(runs), "",
        "Held-out samples passed, by task family:", "", *family_table(runs), "",
        f"![curve]({png.name})"])


def write_report(path: Path, args: argparse.Namespace, settings: RecipeSettings,
                 stages: Stages, body: list[str]) -> None:
    """A staged benchmark's results file: the command and settings that reproduce it, `body`,
    then every stage's wall-clock; printed too."""
    script = Path(sys.argv[0]).name
    wall = sum(stage.seconds for stage in stages.recorded.values())
    lines = [f"# benchmarks/{script}", "",
             f"Command: `{' '.join(['.venv/bin/python', f'benchmarks/{script}', *sys.argv[1:]])}`",
             "", "Settings: " + ", ".join(f"{k}={v}" for k, v in asdict(settings).items()),
             f"; overrides: {' '.join(args.set)}", "",
             f"Held-out tasks: `{settings.heldout_source}`; demonstrations: "
             f"`{settings.train_source}`; RL: `{settings.rl_source}`.", "", *body, "",
             "| stage | seconds | load before | load after |", "|---|---:|---:|---:|",
             *[f"| {k} | {v.seconds:.0f} | {v.load_before:.1f} | {v.load_after:.1f} |"
               for k, v in stages.recorded.items()],
             "", f"Wall-clock, all stages: {wall / 60:.1f} min on {os.cpu_count()} cores."]
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    guarded(lambda: run(parse_args()))


def guarded(work: Callable[[], None]) -> None:
    """Run a staged benchmark: a stop or a bad setting is one line (and the same command
    resumes), never a traceback."""
    stop_on_sigterm()  # a stopped benchmark stops its stage (and its child) on the way out
    try:
        work()
    except UserError as error:  # e.g. an output folder holding a run with other settings
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except RunStopped as stopped:
        print(f"stopped: {stopped}; the same command resumes", file=sys.stderr)
        sys.exit(stopped.exit_code)
    except KeyboardInterrupt:
        print("stopped: interrupted; the same command resumes", file=sys.stderr)
        sys.exit(130)


def recipe_parser(description: str, output: str) -> argparse.ArgumentParser:
    """The options of a staged recipe benchmark, with this benchmark's defaults."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--output", type=Path, default=Path(output))
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--families", default="write-file@2,replace-text@2,sort-lines@2")
    parser.add_argument("--train-seeds", type=int, default=16)
    parser.add_argument("--heldout-seeds", type=int, default=6)
    parser.add_argument("--sft-epochs", type=int, default=2)
    parser.add_argument("--sft-lr", type=float, default=5e-5)
    parser.add_argument("--rl-steps", type=int, default=8)
    parser.add_argument("--rl-lr", type=float, default=4e-4)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--groups-per-step", type=int, default=3)
    parser.add_argument("--eval-samples", type=int, default=10)
    parser.add_argument("--rl-seeds", type=int, default=48,
                        help="training seeds per family for RL (0: the demonstrations' seeds)")
    parser.add_argument("--set", action="append", default=[
        "agent.name=terminus", "agent.max_turns=2", "inference.max_tokens=112",
        "agent.timeout_s=900", "collector.max_concurrent_sandboxes=16",
        "trainer.lora_rank=16", "trainer.skip_uniform_groups=true", "trainer.advantage=dr_grpo",
        "trainer.micro_batch_tokens=1024"],
        help="config overrides (section.key=value), after the defaults shown")
    return parser


def parse_args() -> argparse.Namespace:
    parser = recipe_parser(__doc__.split("\n")[0], "runs/learning-curve")
    parser.add_argument("--base-eval-samples", type=int, default=2,
                        help="samples per held-out task for the base model (0: --eval-samples); "
                        "it passes none, and its replies run to the token limit")
    return parser.parse_args()


def warm_started(args: argparse.Namespace) -> tuple[RecipeSettings, RunConfig, Stages, Path]:
    """The recipe's settings and config from the options, and the shared warm start (the
    demonstrations and the SFT model, done once; a finished stage is skipped)."""
    settings = RecipeSettings(args.families, args.train_seeds, args.heldout_seeds,
                              args.sft_epochs, 8, args.sft_lr, args.rl_steps, args.rl_lr, args.n,
                              args.groups_per_step, args.eval_samples, args.rl_seeds)
    settings.check()
    config = load_config(None, args.set)
    stages = Stages.load(args.output / "stages.json")
    print(f"warm start -> {args.output}", flush=True)
    sft_model = warm_start(config.model_copy(update={"trainer": config.trainer.model_copy(
        update={"lora_rank": 0})}), settings, args.output, stages)
    return settings, config, stages, sft_model


def run(args: argparse.Namespace) -> None:
    settings, config, stages, sft_model = warm_started(args)
    runs = [one_seed(config, settings, sft_model, args.output, seed, stages,
                     args.base_eval_samples)
            for seed in args.seeds]
    write_results(args, settings, runs, stages)


if __name__ == "__main__":
    main()
