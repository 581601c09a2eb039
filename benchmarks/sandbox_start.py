"""Sandbox start + exec(`true`) + stop: median of N runs, local vs docker, side by side.

Targets: local <= 0.1 s, docker <= 1.5 s. Run: .venv/bin/python benchmarks/sandbox_start.py [N]
(docker is skipped with a note when no engine answers).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

from skyrl_agent.config import SandboxConfig
from skyrl_agent.sandboxes.base import SandboxSpec, UnsupportedEnvironment, create_sandbox
from skyrl_agent.tasks import find_task

TARGETS = {"local": 0.1, "docker": 1.5}


async def one_cycle(spec: SandboxSpec, config: SandboxConfig) -> float:
    started = time.perf_counter()
    async with create_sandbox(spec, config) as sandbox:
        result = await sandbox.exec("true", timeout=30)
        assert result.ok, result
    return time.perf_counter() - started


async def measure(backend: str, runs: int) -> list[float] | None:
    config = SandboxConfig(backend=backend)
    spec = SandboxSpec.from_task(find_task("demo/word-count"), config)
    try:
        await one_cycle(spec, config)  # warm-up: builds the docker image once
    except UnsupportedEnvironment as exc:
        print(f"{backend}: skipped ({exc})")
        return None
    return [await one_cycle(spec, config) for _ in range(runs)]


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    medians = {}
    for backend in ("local", "docker"):
        times = asyncio.run(measure(backend, runs))
        if times:
            medians[backend] = statistics.median(times)
    print(f"\nstart + exec(true) + stop, median of {runs}")
    print(f"{'backend':8} {'median s':>9} {'target s':>9}  verdict")
    for backend, median in medians.items():
        verdict = "ok" if median <= TARGETS[backend] else "SLOWER THAN TARGET"
        print(f"{backend:8} {median:9.3f} {TARGETS[backend]:9.2f}  {verdict}")
    if len(medians) == 2:
        print(f"docker / local = {medians['docker'] / medians['local']:.1f}x")


if __name__ == "__main__":
    main()
