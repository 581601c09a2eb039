"""What the SWE verdict's challenge costs: the bundled swe-mini gold patches verified with and
without it (nonce, tripwires, FAIL_TO_PASS tests run alone), side by side in one run, on both
backends. Verification time is the episode's verify_time_s (test.sh with the screen, the
launcher and its children), one task at a time so the two arms do not share the cores.

Must show: every gold patch still 1.0 with the challenge; the price per task.
Run: .venv/bin/python benchmarks/swe_challenge.py [ROUNDS]
Writes benchmarks/results/swe_challenge.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import sys
from pathlib import Path

from skyrl_agent.collector.check import check_tasks
from skyrl_agent.config import SandboxConfig
from skyrl_agent.sandboxes.base import UnsupportedEnvironment
from skyrl_agent.tasks import resolve_tasks
from skyrl_agent.tasks.spec import TaskSpec

RESULTS = Path(__file__).parent / "results" / "swe_challenge.md"


def arm(tasks: list[TaskSpec], challenged: bool) -> list[TaskSpec]:
    return [dataclasses.replace(t, grader=dataclasses.replace(t.grader, challenged=challenged))
            for t in tasks]


async def verify_times(tasks: list[TaskSpec], backend: str, rounds: int) -> dict[bool, list]:
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(rounds):
        for challenged in (False, True):  # alternated: drift in the machine hits both arms
            results = await check_tasks(arm(tasks, challenged), "oracle",
                                        SandboxConfig(backend=backend), jobs=1)
            bad = [(r.task, r.reward, r.reason) for r in results if r.reward != 1.0]
            if bad:
                raise SystemExit(f"a gold patch failed ({backend}, challenge={challenged}): {bad}")
            times[challenged] += [r.verify_time_s for r in results]
    return times


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    tasks = resolve_tasks("swe-mini")
    rows = []
    for backend in ("local", "docker"):
        try:
            times = asyncio.run(verify_times(tasks, backend, rounds))
        except UnsupportedEnvironment as exc:
            print(f"{backend}: skipped ({exc})")
            continue
        plain, challenged = (statistics.median(times[c]) for c in (False, True))
        rows.append(f"| {backend} | {len(times[True])} | {plain:.2f} | {challenged:.2f} | "
                    f"{challenged - plain:+.2f} | {challenged / plain:.2f}x |")
        print(rows[-1], flush=True)
    RESULTS.write_text("\n".join([
        "# SWE verification with and without the challenge (swe-mini gold patches)", "",
        f"`.venv/bin/python benchmarks/swe_challenge.py {rounds}`: verify_time_s per task,",
        "median, every gold patch 1.0 in both arms (2 cores).", "",
        "| backend | verifications per arm | plain s | challenged s | added s | ratio |",
        "|---|---|---|---|---|---|", *rows, ""]))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
