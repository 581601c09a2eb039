"""Same rewards as Harbor: oracle and nop through Harbor's own trial lifecycle and through ours.

    .venv/bin/python benchmarks/harbor_parity.py            # writes results/harbor_parity.md

Per task and agent (oracle, nop), side by side:
- Harbor: the trial `harbor run` runs (its agent, its verifier and its shared or separate
  verifier mode, as the task says), in a docker container of our docker backend
  (`-e skyrl_agent.harbor:SkyrlEnvironment --ek backend=docker`). Harbor's own docker
  environment cannot be the container here: it enforces `no-network` tasks with an egress
  control sidecar whose kernel probe and image it pulls, so offline it rejects every such task.
- Ours: `skyrl-agent tasks check --sandbox docker` (our episode: separate verification unless
  the task says shared).

The table gives each side's reward (or the error that left it without one) and seconds. Needs a
running Docker engine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from skyrl_agent.tasks.sources import resolve_tasks  # noqa: E402
from skyrl_agent.tasks.spec import TaskSpec  # noqa: E402

SETS = ["demo", "swe-mini", "gen:count:train:2", "gen:fix-bug:train:2",
        "gen:git-commit:train:2"]
AGENTS = ("oracle", "nop")
ENVIRONMENT = "skyrl_agent.harbor:SkyrlEnvironment"


@dataclass(frozen=True)
class Outcome:
    reward: float | None
    error: str | None
    seconds: float

    def cell(self) -> str:
        return f"{self.reward:.2f}" if self.reward is not None else f"none ({self.error})"


async def harbor_trial(task: TaskSpec, agent: str, trials: Path, work_root: Path) -> Outcome:
    """The trial `harbor run -p TASK -a AGENT -e SkyrlEnvironment --ek backend=docker` runs."""
    from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
    from harbor.trial.trial import Trial

    started = time.monotonic()
    config = TrialConfig(
        task=TaskConfig(path=task.task_dir), trials_dir=trials, agent=AgentConfig(name=agent),
        environment=EnvironmentConfig(import_path=ENVIRONMENT, kwargs={
            "backend": "docker", "work_root": str(work_root)}))
    result = await (await Trial.create(config)).run()
    rewards = result.verifier_result.rewards if result.verifier_result else None
    error = result.exception_info.exception_type if result.exception_info else None
    reward = None if not rewards else float(rewards.get("reward", next(iter(rewards.values()))))
    return Outcome(reward, error, time.monotonic() - started)


def ours(source: str, agent: str, work_root: Path) -> dict[str, Outcome]:
    """`tasks check` on the whole set, one sandbox at a time (like the Harbor side)."""
    command = [str(ROOT / ".venv" / "bin" / "skyrl-agent"), "tasks", "check", source, "--agent",
               agent, "--sandbox", "docker", "--json", "-j", "1", "--set",
               f"sandbox.work_root={work_root}"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode not in (0, 1):
        raise SystemExit(f"tasks check failed: {done.stderr[-2000:]}")
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {row["task"]: Outcome(row["reward"], row["reason"],
                                 row["sandbox_time_s"] + row["agent_time_s"]
                                 + row["verify_time_s"]) for row in rows}


def table(rows: list[tuple[str, str, Outcome, Outcome]], command: str) -> str:
    agree = sum(h.reward == o.reward for _, _, h, o in rows)
    lines = ["# Same rewards as Harbor", "",
             f"`{command}` (regenerates this file; needs a Docker engine).", "",
             "Harbor: the trial `harbor run` runs (its agent, its verifier, its verifier mode) "
             "in our docker backend's container. Ours: `tasks check --sandbox docker`. Seconds "
             "are each side's wall time for the task (ours: sandbox + agent + verification).",
             "", f"**Agree on {agree} of {len(rows)}.**", "",
             "| task | agent | harbor run | ours | agree | harbor s | ours s |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, agent, harbor, mine in rows:
        same = "yes" if harbor.reward == mine.reward else "**no**"
        lines.append(f"| {name} | {agent} | {harbor.cell()} | {mine.cell()} | {same} | "
                     f"{harbor.seconds:.1f} | {mine.seconds:.1f} |")
    return "\n".join(lines) + "\n"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", default=SETS)
    parser.add_argument("--output", type=Path,
                        default=ROOT / "benchmarks" / "results" / "harbor_parity.md")
    args = parser.parse_args()
    rows: list[tuple[str, str, Outcome, Outcome]] = []
    with tempfile.TemporaryDirectory(prefix="harbor-parity-") as scratch:
        work_root = Path(scratch) / "roots"
        work_root.mkdir()
        for folder in (Path(scratch), work_root):
            folder.chmod(0o711)  # the unprivileged sandbox user passes through
        for source in args.sets:
            for agent in AGENTS:
                mine = ours(source, agent, work_root)
                for task in resolve_tasks(source):
                    harbor = await harbor_trial(task, agent, Path(scratch) / "trials", work_root)
                    rows.append((task.name, agent, harbor, mine[task.name]))
                    print(f"{task.name} {agent}: harbor {harbor.cell()}, ours "
                          f"{mine[task.name].cell()}", flush=True)
    command = "python benchmarks/harbor_parity.py" + (
        f" --sets {' '.join(args.sets)}" if args.sets != SETS else "")
    args.output.write_text(table(rows, command))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    asyncio.run(main())
