"""Does training through self-summarization help? RL with the context managed by summaries, by
truncation (the oldest turns dropped) and not at all (the trajectory ends when the context is
full), side by side on the same held-out seeds of a long-horizon family whose reading does not
fit the context.

The pipeline is learning_curve.py's (`skyrl_agent/jobs/recipe.py`): Terminus with the bundled
SmolLM2-135M on the embedded CPU server, generated tasks in local sandboxes, the torch trainer.

1. demonstrations of the family's training seeds: the task's walkthrough acted out a step per
   reply, the scripted teacher answering each summary request with what was found so far
   (`skyrl_agent/collector/demos.py`); once;
2. SFT on them, once: the one warm start every arm and seed starts from;
3. per seed, per arm (`agent.context_management` = summarize, truncate, none): held-out
   evaluation of the SFT model under the arm, RL from it under the arm, held-out evaluation of
   the RL model under the arm.

Credit across the summary boundary: a trajectory is one sample of its group, whatever its
segments; every turn of every segment, the summary replies included, is trained with the
trajectory's advantage (`rl/batch.py`). A summary that lost what a later segment needed
ends in a failed trajectory, and its tokens are pushed down with the rest.

Per arm and seed the table reports held-out pass@1, turns and segments per trajectory, the share
of trajectories that end by context overflow, and the share of RL-stage trajectories with two
segments or more. The verdict: summarization's mean RL pass@1 above both other arms' by more
than the seed-to-seed spread.

Run: .venv/bin/python benchmarks/summarization.py [--seeds 0 1 2] [--rl-steps 6] ...
The same command resumes (every stage keeps its folder under --output).
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from learning_curve import (
    Stages,
    guarded,
    recipe_parser,
    save_figure,
    sft_then_rl,
    spread,
    warm_started,
    write_report,
)

from skyrl_agent.config import RunConfig
from skyrl_agent.data.store import TrajectoryStore
from skyrl_agent.jobs.recipe import RecipeSettings, Score
from skyrl_agent.types import FinishReason

RESULTS = Path(__file__).parent / "results"
ARMS = ("summarize", "truncate", "none")


@dataclass(frozen=True)
class Shape:
    """How a set of trajectories went, beside their pass rate."""

    turns: float
    """Mean model calls per trajectory (summaries included)."""
    segments: float
    """Mean segments per trajectory."""
    multi_segment: float
    """Share with two segments or more."""
    overflow: float
    """Share that ended by context overflow."""

    @classmethod
    def of(cls, run_dir: Path) -> Shape:
        kept = [t for t in TrajectoryStore(run_dir).load().trajectories if not t.masked]
        n = max(len(kept), 1)
        return cls(sum(t.num_turns for t in kept) / n, sum(len(t.segments) for t in kept) / n,
                   sum(len(t.segments) >= 2 for t in kept) / n,
                   sum(t.finish_reason == FinishReason.CONTEXT_OVERFLOW for t in kept) / n)


@dataclass
class ArmRun:
    arm: str
    seed: int
    scores: dict[str, Score] = field(default_factory=dict)
    shapes: dict[str, Shape] = field(default_factory=dict)
    """Per model (`sft`, `rl`) on the held-out tasks, and `train` for the RL stage's samples."""
    rl_rewards: list[float] = field(default_factory=list)


def one_arm(config: RunConfig, settings: RecipeSettings, sft_model: Path, root: Path,
            seed: int, arm: str, stages: Stages) -> ArmRun:
    config = config.model_copy(update={"seed": seed, "agent": config.agent.model_copy(
        update={"context_management": arm})})
    out = root / f"seed-{seed}" / arm
    result = ArmRun(arm, seed)
    result.scores["sft"], result.rl_rewards, result.scores["rl"] = sft_then_rl(
        config, settings, sft_model, out, f"seed {seed} {arm}", stages)
    result.shapes = {"sft": Shape.of(out / "eval-sft"), "rl": Shape.of(out / "eval-rl"),
                     "train": Shape.of(out / "train")}
    print(f"  seed {seed} {arm}: sft {result.scores['sft'].pass_rate:.3f}, "
          f"rl {result.scores['rl'].pass_rate:.3f}", flush=True)
    return result


def mean_rl(runs: list[ArmRun], arm: str) -> tuple[float, float]:
    rates = [r.scores["rl"].pass_rate for r in runs if r.arm == arm]
    return statistics.mean(rates), spread(rates)


def arms_of(runs: list[ArmRun]) -> list[str]:
    """The arms these runs cover, in ARMS order."""
    return [arm for arm in ARMS if any(r.arm == arm for r in runs)]


def verdict(runs: list[ArmRun]) -> str:
    if arms_of(runs) != list(ARMS):
        return f"No verdict: it needs all three arms ({', '.join(ARMS)}), these runs have " \
               f"{', '.join(arms_of(runs))}."
    means = {arm: mean_rl(runs, arm) for arm in ARMS}
    worst = max(s for _, s in means.values())
    margin = means["summarize"][0] - max(means["truncate"][0], means["none"][0])
    return (f"Summarization above truncation and none by more than the seed-to-seed spread: "
            f"{'yes' if margin > worst else 'NO'} (margin {margin:+.3f}; largest spread "
            f"{worst:.3f}; means " + ", ".join(f"{a} {m:.3f}" for a, (m, _) in means.items())
            + ")")


def table(runs: list[ArmRun]) -> list[str]:
    rows = ["| arm | seed | SFT pass@1 | RL pass@1 | RL turns | RL segments | RL overflow | "
            "RL-stage >=2 segments | RL training reward by step |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in sorted(runs, key=lambda r: (ARMS.index(r.arm), r.seed)):
        rl, train = r.shapes["rl"], r.shapes["train"]
        rows.append(f"| {r.arm} | {r.seed} | {r.scores['sft'].pass_rate:.3f} | "
                    f"{r.scores['rl'].pass_rate:.3f} | {rl.turns:.1f} | {rl.segments:.2f} | "
                    f"{rl.overflow:.2f} | {train.multi_segment:.2f} | "
                    f"{' '.join(f'{x:.2f}' for x in r.rl_rewards)} |")
    for arm in arms_of(runs):
        mean, width = mean_rl(runs, arm)
        sft = [r.scores["sft"].pass_rate for r in runs if r.arm == arm]
        rows.append(f"| {arm} | mean (spread) | {statistics.mean(sft):.3f} ({spread(sft):.3f}) | "
                    f"{mean:.3f} ({width:.3f}) | | | | | |")
    return rows


def plot(runs: list[ArmRun], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    arms = arms_of(runs)
    for index, arm in enumerate(arms):
        mine = [r for r in runs if r.arm == arm]
        for stage, offset in (("sft", -0.15), ("rl", 0.15)):
            rates = [r.scores[stage].pass_rate for r in mine]
            axis.scatter([index + offset] * len(rates), rates, alpha=0.6,
                         marker="o" if stage == "rl" else "x",
                         color="tab:blue" if stage == "rl" else "tab:gray",
                         label=stage.upper() if index == 0 else None)
            axis.hlines(statistics.mean(rates), index + offset - 0.1, index + offset + 0.1,
                        color="black")
    axis.set_xticks(range(len(arms)), arms)
    axis.set(title="held-out pass@1 by context management", ylim=(-0.02, 1.02))
    axis.legend()
    save_figure(figure, path)


def write_results(args: argparse.Namespace, settings: RecipeSettings, runs: list[ArmRun],
                  stages: Stages) -> None:
    args.results.mkdir(parents=True, exist_ok=True)
    png = args.results / "summarization.png"
    plot(runs, png)
    write_report(args.results / "summarization.md", args, settings, stages,
                 [*table(runs), "", verdict(runs), "", f"![arms]({png.name})"])


def parse_args() -> argparse.Namespace:
    parser = recipe_parser(__doc__.split("\n")[0], "runs/summarization")
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.set_defaults(
        families="follow-clues@2", train_seeds=32, heldout_seeds=12, sft_epochs=3, rl_steps=6,
        n=6, eval_samples=2, rl_seeds=96, set=[
            "agent.name=terminus", "agent.max_turns=20", "agent.max_context_tokens=2048",
            "inference.max_tokens=112", "agent.timeout_s=900",
            "collector.max_concurrent_sandboxes=16", "trainer.lora_rank=16",
            "trainer.skip_uniform_groups=true", "trainer.advantage=dr_grpo",
            "trainer.micro_batch_tokens=2048"])
    return parser.parse_args()


def run(args: argparse.Namespace) -> None:
    settings, config, stages, sft_model = warm_started(args)
    runs = [one_arm(config, settings, sft_model, args.output, seed, arm, stages)
            for seed in args.seeds for arm in args.arms]
    write_results(args, settings, runs, stages)


def main() -> None:
    guarded(lambda: run(parse_args()))


if __name__ == "__main__":
    main()
