"""Sandbox start + exec(`true`) + stop: median of N runs, local vs docker, side by side; and what
separate-mode verification adds (kill the agent's processes, collect the workdir, start a fresh
sandbox, restore it) beside shared mode (kill only).

Targets: local <= 0.1 s, docker <= 1.5 s. Run: .venv/bin/python benchmarks/sandbox_start.py [N]
(docker is skipped with a note when no engine answers).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

from skyrl_agent.config import SandboxConfig
from skyrl_agent.envs.verifier import ArtifactPath, collect_bundle, restore_bundle
from skyrl_agent.sandboxes.artifacts import ArtifactLimits
from skyrl_agent.sandboxes.base import SandboxSpec, UnsupportedEnvironment, create_sandbox
from skyrl_agent.tasks import find_task

TARGETS = {"local": 0.1, "docker": 1.5}


async def one_cycle(spec: SandboxSpec, config: SandboxConfig) -> float:
    started = time.perf_counter()
    async with create_sandbox(spec, config) as sandbox:
        result = await sandbox.exec("true", timeout=30)
        assert result.ok, result
    return time.perf_counter() - started


async def verification_handover(spec: SandboxSpec, config: SandboxConfig,
                                separate: bool) -> float:
    """Seconds from "the agent stopped" to "the tests may start", after a small agent edit."""
    paths = (ArtifactPath(spec.workdir),)
    async with create_sandbox(spec, config) as sandbox:
        await sandbox.exec("echo edited > notes.txt && (sleep 100 > /dev/null 2>&1 &)", timeout=30)
        started = time.perf_counter()
        await sandbox.kill_processes()
        if not separate:
            return time.perf_counter() - started
        bundle = await collect_bundle(sandbox, paths, ArtifactLimits())
    async with create_sandbox(spec, config) as fresh:
        await restore_bundle(fresh, bundle, paths)
        return time.perf_counter() - started


async def measure_handover(backend: str, runs: int) -> tuple[float, float]:
    config = SandboxConfig(backend=backend)
    spec = SandboxSpec.from_task(find_task("demo/word-count"), config)
    shared = [await verification_handover(spec, config, False) for _ in range(runs)]
    separate = [await verification_handover(spec, config, True) for _ in range(runs)]
    return statistics.median(shared), statistics.median(separate)


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
    print(f"\nverification hand-over (agent stopped -> tests may start), median of {runs}")
    print(f"{'backend':8} {'shared s':>9} {'separate s':>11}  separate / shared")
    for backend in medians:
        shared, separate = asyncio.run(measure_handover(backend, runs))
        print(f"{backend:8} {shared:9.3f} {separate:11.3f}  {separate / shared:.1f}x")


if __name__ == "__main__":
    main()
