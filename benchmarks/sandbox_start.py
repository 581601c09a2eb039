"""Episode overhead: the sandbox work around an agent, as run_episode does it, beside a bare
`bwrap` create->exit measured in the same loop, for both backends.

Each episode is demo/word-count solved by a one-command agent that also leaves a process
running, then "thinks" for AGENT_S (an agent's turns take longer than that; the verifier's
sandbox starts meanwhile). It runs as the collector runs it: a SandboxPool that stops in the
background, run_episode keeping each final state on disk; the episode's time account gives:
  start     sandbox_time_s   the agent's sandbox (a pool hit, or a start)
  hand-over handover_time_s  kill the agent's processes, the verifier's sandbox, restore,
            + collect_time_s  and the collection of its artifacts
  stop      stop_time_s      releasing the agent's sandbox
`sustained` is the loop's wall time per episode minus AGENT_S, background starts and stops
included: what the sandbox work costs when nothing hides it.

Must show: local overhead (start + hand-over + stop) p50 <= 3x the bare bwrap p50; docker
hand-over p50 <= 0.5 s.
Run: .venv/bin/python benchmarks/sandbox_start.py [N]   Writes benchmarks/results/sandbox_start.md.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from skyrl_agent.config import SandboxConfig, VerifierConfig
from skyrl_agent.envs.episode import AgentOutcome, run_episode
from skyrl_agent.sandboxes.base import SandboxSpec, UnsupportedEnvironment
from skyrl_agent.sandboxes.pool import SandboxPool
from skyrl_agent.tasks import find_task
from skyrl_agent.types import FinishReason

RESULTS = Path(__file__).parent / "results" / "sandbox_start.md"
AGENT_S = 0.3
SETTLE_S = 0.1  # before the bare run: the previous episode's background stops are done
BARE = ["bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr",
        "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
        "--symlink", "usr/bin", "/bin", "--proc", "/proc", "--dev", "/dev", "--", "/bin/true"]
TASK = "demo/word-count"


def bare_bwrap() -> float:
    started = time.perf_counter()
    subprocess.run(BARE, check=True)
    return time.perf_counter() - started


async def solve(env) -> AgentOutcome:
    await env.exec("wc -w < story.txt > word_count.txt && (sleep 100 >/dev/null 2>&1 &)",
                   timeout=30)
    await asyncio.sleep(AGENT_S)
    return AgentOutcome(FinishReason.STOP)


async def measure(backend: str, pool_size: int, runs: int) -> dict[str, list[float]] | None:
    config = SandboxConfig(backend=backend)
    task = find_task(TASK)
    pool = SandboxPool(config, size=pool_size, stop_in_background=True)
    rows: dict[str, list[float]] = {k: [] for k in ("start", "handover", "stop", "bare")}
    try:
        await pool.warm(SandboxSpec.from_task(task, config))  # size 0: builds docker's image
    except UnsupportedEnvironment as exc:
        print(f"{backend}: skipped ({exc})")
        return None
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as states:
        try:
            for index in range(runs):
                await asyncio.sleep(SETTLE_S)
                rows["bare"].append(await asyncio.to_thread(bare_bwrap))
                episode = await run_episode(task, solve, pool, VerifierConfig(),
                                            keep_state=Path(states) / f"{index}.tgz")
                assert episode.reward.value == 1.0, episode.reward.reason  # restored
                rows["start"].append(episode.sandbox_time_s)
                rows["handover"].append(episode.handover_time_s + episode.collect_time_s)
                rows["stop"].append(episode.stop_time_s)
        finally:
            await pool.close()
    wall = time.perf_counter() - began
    rows["overhead"] = [sum(parts) for parts in
                        zip(rows["start"], rows["handover"], rows["stop"], strict=True)]
    rows["sustained"] = [wall / runs - AGENT_S - SETTLE_S - statistics.mean(rows["bare"])]
    print(f"{backend} pool={pool_size}: pool hits {pool.hits}, misses {pool.misses}")
    return rows


def p50_p95(values: list[float]) -> str:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"{statistics.median(ordered) * 1e3:.1f} / {p95 * 1e3:.1f}"


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    table, verdicts = [], []
    for backend in ("local", "docker"):
        for pool_size in (1, 0):
            rows = asyncio.run(measure(backend, pool_size, runs))
            if rows is None:
                break
            ratio = statistics.median(rows["overhead"]) / statistics.median(rows["bare"])
            table.append(f"| {backend} | {pool_size} | {p50_p95(rows['start'])} | "
                         f"{p50_p95(rows['handover'])} | {p50_p95(rows['stop'])} | "
                         f"{p50_p95(rows['overhead'])} | {p50_p95(rows['bare'])} | "
                         f"{ratio:.1f}x | {rows['sustained'][0] * 1e3:.0f} |")
            if backend == "local" and pool_size == 1:
                verdicts.append(f"- local overhead p50 = {ratio:.1f}x bare bwrap (goal <= 3x): "
                                f"{'met' if ratio <= 3 else 'NOT met'}")
            if backend == "docker" and pool_size == 1:
                handover = statistics.median(rows["handover"])
                verdicts.append(f"- docker hand-over p50 = {handover:.3f} s (goal <= 0.5 s): "
                                f"{'met' if handover <= 0.5 else 'NOT met'}")
    lines = ["# Episode overhead: the sandbox work around an agent", "",
             f"`benchmarks/sandbox_start.py {runs}`: {runs} episodes of {TASK} per row through "
             "run_episode (separate-mode verification, the verifier's sandbox started while the "
             f"agent thinks {AGENT_S} s, stops in the background); p50 / p95 in ms from the "
             "episodes' time account, beside a bare `bwrap` create->exit run in the same loop. "
             "`sustained`: the loop's wall ms per episode less the agent's think time, the pause "
             "and the bare run, background starts and stops included.", "",
             "| backend | warm pool | start | hand-over | stop | overhead | bare bwrap | "
             "overhead / bare | sustained ms |",
             "|---|---|---|---|---|---|---|---|---|", *table, "", *verdicts, ""]
    RESULTS.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
