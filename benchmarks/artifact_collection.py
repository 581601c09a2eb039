"""Collecting a docker sandbox's files when the agent filled its folder with links.

The attack (issue 54): 1,500 symlinks listed before 30,000 hard links. A reader that compared
every member with every symlink seen before it did 45 M prefix comparisons for this one sample,
on a thread shared with every sandbox command of the run. Measured here, each case in a fresh
container of demo/hello-file:
  engine+reader  sandbox.collect("/app"): the engine's archive read member by member
  reader         collect_tar_stream over the same archive held in memory (the host's own part)
Cases: the hard links alone, and the symlinks listed before them.

Run: .venv/bin/python benchmarks/artifact_collection.py [LINKS] [HARDLINKS]
Writes benchmarks/results/artifact_collection.md (not part of CI).
"""

from __future__ import annotations

import asyncio
import io
import sys
import time
from pathlib import Path

from skyrl_agent.config import SandboxConfig
from skyrl_agent.sandboxes.artifacts import ArtifactLimits, BundleWriter
from skyrl_agent.sandboxes.base import SandboxSpec, create_sandbox
from skyrl_agent.sandboxes.engine_archive import collect_tar_stream
from skyrl_agent.tasks import find_task

RESULTS = Path(__file__).parent / "results" / "artifact_collection.md"
LIMITS = ArtifactLimits(max_bytes=64 * 1024 * 1024, max_entries=200_000)
# The symlinks sort before the hard links ("a-" < "h-"): the engine lists a folder in name order.
SETUP = (
    "mkdir -p /app/bench && cd /app/bench && echo data > h-0 && "
    "for i in $(seq 1 {links}); do ln -s /etc a-$i; done && "
    "for i in $(seq 1 {hard}); do ln h-0 h-$i; done"
)


async def measure(links: int, hard: int) -> tuple[float, float]:
    config = SandboxConfig(backend="docker")
    spec = SandboxSpec.from_task(find_task("demo/hello-file"), config)
    async with create_sandbox(spec, config) as sandbox:
        made = await sandbox.exec(SETUP.format(links=links, hard=hard), timeout=600)
        assert made.ok, made.stderr
        started = time.perf_counter()
        with BundleWriter(io.BytesIO(), LIMITS) as writer:
            await sandbox.collect("/app", writer)
        whole = time.perf_counter() - started
        stream, _ = sandbox.running.get_archive("/app", chunk_size=1 << 20)  # type: ignore[attr-defined]
        data = b"".join(stream)
    chunks = [data[i : i + (1 << 20)] for i in range(0, len(data), 1 << 20)]
    started = time.perf_counter()
    with BundleWriter(io.BytesIO(), LIMITS) as writer:
        collect_tar_stream(chunks, "/app", writer)
    return whole, time.perf_counter() - started


async def main(links: int, hard: int) -> None:
    rows = []
    for name, n_links in (("hard links alone", 0), (f"{links} symlinks first", links)):
        whole, reader = await measure(n_links, hard)
        rows.append(f"| {name} | {hard} | {whole:.2f} | {reader:.2f} |")
        print(rows[-1], flush=True)
    table = "\n".join(
        ["| case | hard links | engine+reader s | reader s |", "|---|---|---|---|", *rows]
    )
    RESULTS.write_text(
        "# Artifact collection with links (docker)\n\n"
        f"`.venv/bin/python benchmarks/artifact_collection.py {links} {hard}`: seconds, one "
        "run each, in a fresh demo/hello-file container (2 cores). engine+reader: "
        "`sandbox.collect(\"/app\")`; reader: `collect_tar_stream` over the same archive in "
        f"memory.\n\n{table}\n")


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    asyncio.run(main(*(args + [1500, 30_000][len(args) :])))
