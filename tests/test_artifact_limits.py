"""Collecting a sandbox's files is bounded whatever the agent left there (issue 54, item 3).

Stops: hard links and FIFOs that were read but never counted toward the file limit; a reader
that compared each archive member with every symlink before it (quadratic: 1,500 links x 30,000
hard links held a shared host thread for half a minute); a collection with no time bound and
nothing in the time account; collections run on the threads every sample's commands need.
"""

from __future__ import annotations

import asyncio
import io
import tarfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from skyrl_agent.config import VerifierConfig
from skyrl_agent.envs.episode import AgentOutcome, fresh_sandboxes, run_episode
from skyrl_agent.sandboxes import engine_archive
from skyrl_agent.sandboxes.artifacts import (
    ArtifactLimitExceeded,
    ArtifactLimits,
    BundleWriter,
    CollectionTimedOut,
    bundle_names,
    run_collection,
)
from skyrl_agent.sandboxes.base import SandboxSpec, create_sandbox
from skyrl_agent.sandboxes.engine_archive import collect_tar_stream
from skyrl_agent.tasks import find_task
from skyrl_agent.types import FailureKind, FinishReason

LINKS_AND_FIFOS = (
    "mkdir -p /app/many && cd /app/many && echo data > f && "
    "for i in $(seq 1 150); do ln f h$i && mkfifo p$i; done"
)


def _spec(sandbox_config) -> SandboxSpec:
    return SandboxSpec.from_task(find_task("demo/hello-file"), sandbox_config)


@pytest.mark.slow
async def test_hard_links_and_fifos_count_toward_the_file_limit(sandbox_config):
    """Stops: a folder of hard links and FIFOs (left out of the bundle, so never counted)
    read past the file limit on either backend."""
    async with create_sandbox(_spec(sandbox_config), sandbox_config) as sandbox:
        made = await sandbox.exec(LINKS_AND_FIFOS, timeout=60)
        assert made.ok, made.stderr
        with (
            pytest.raises(ArtifactLimitExceeded, match="more than 200 files"),
            BundleWriter(io.BytesIO(), ArtifactLimits(max_entries=200)) as writer,
        ):
            await sandbox.collect("/app/many", writer)
        # Within the limit the FIFOs stay out of the bundle, counted all the same.
        out = io.BytesIO()
        with BundleWriter(out, ArtifactLimits(max_entries=400)) as writer:
            assert await sandbox.collect("/app/many", writer)
        assert writer.entries == 302  # the folder, f, 150 links, 150 FIFOs
    names = set(bundle_names(out.getvalue()))
    assert "app/many/f" in names and not any(n.startswith("app/many/p") for n in names)


@pytest.mark.slow
async def test_collection_runs_apart_from_the_command_threads(sandbox_config):
    """Stops: collections on the event loop's default executor, where every sample's docker
    commands run: with that pool full, a collection still finishes."""
    async with create_sandbox(_spec(sandbox_config), sandbox_config) as sandbox:
        assert (await sandbox.exec("mkdir -p /app/c && touch /app/c/x", timeout=60)).ok
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(1))
        holding, release = threading.Event(), threading.Event()

        def hold() -> None:  # the one command thread, held as other samples' commands would
            holding.set()
            release.wait(60)

        busy = asyncio.ensure_future(asyncio.to_thread(hold))
        while not holding.is_set():
            await asyncio.sleep(0.01)
        try:
            with BundleWriter(io.BytesIO(), ArtifactLimits()) as writer:
                assert await asyncio.wait_for(sandbox.collect("/app/c", writer), 30)
        finally:
            release.set()
            await busy


def _archive(links: int, hard: int, files: int) -> bytes:
    """An engine-like archive of /app/d: `links` symlinks listed first, then hard links and
    files, and one member listed through a link (dropped)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def add(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> None:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, linkname
            tar.addfile(info, io.BytesIO(b""))

        add("d", tarfile.DIRTYPE)
        for i in range(links):
            add(f"d/a-{i}", tarfile.SYMTYPE, "/etc")
        add("d/a-0/through")
        for i in range(hard):
            add(f"d/h-{i}", tarfile.LNKTYPE, "d/f-0")
        for i in range(files):
            add(f"d/f-{i}")
    return buffer.getvalue()


def test_the_archive_reader_does_not_scan_the_links_it_holds(monkeypatch):
    """Stops: the quadratic reader. Whether a member lies under a link costs one look-up per
    component of its name, however many links came before it (counted, not timed)."""
    made: list[engine_archive.PrefixSet] = []

    class Counted(engine_archive.PrefixSet):
        def __init__(self) -> None:
            super().__init__()
            made.append(self)

    monkeypatch.setattr(engine_archive, "PrefixSet", Counted)
    links, hard, files = 2000, 3000, 1000
    data = _archive(links, hard, files)
    out = io.BytesIO()
    with BundleWriter(out, ArtifactLimits(max_entries=10_000)) as writer:
        collect_tar_stream(
            [data[i : i + 65536] for i in range(0, len(data), 65536)], "/app/d", writer
        )
    members = 1 + links + 1 + hard + files
    assert writer.entries == members - 1  # all but the one listed through a link
    # "app/d/x" takes 2 look-ups: never one per link (that was links x members = 12 M).
    assert made and made[0].lookups <= 2 * members
    names = set(bundle_names(out.getvalue()))
    assert len(names) == 1 + links + files and "app/d/a-0/through" not in names


def test_hard_links_in_an_archive_count_and_pass_the_limit():
    """Stops: LNKTYPE members skipped without counting toward max_entries."""
    data = _archive(0, 50, 0)
    with (
        pytest.raises(ArtifactLimitExceeded, match="more than 20 files"),
        BundleWriter(io.BytesIO(), ArtifactLimits(max_entries=20)) as writer,
    ):
        collect_tar_stream([data], "/app/d", writer)


def test_a_slow_archive_passes_the_time_bound():
    """Stops: a collection without a wall-time bound (an archive that trickles in)."""
    data = _archive(0, 0, 10)

    def trickle():
        for i in range(0, len(data), 512):
            time.sleep(0.02)
            yield data[i : i + 512]

    with (
        pytest.raises(CollectionTimedOut, match=r"more than 0\.05 s"),
        BundleWriter(io.BytesIO(), ArtifactLimits(max_seconds=0.05)) as writer,
    ):
        collect_tar_stream(trickle(), "/app/d", writer)


async def test_a_reader_blocked_past_its_deadline_is_given_up():
    """Stops: a wait on a collection blocked where it cannot check the time (an engine that
    stopped sending): given up after the grace, its writer abandoned, never closed under it."""
    release = threading.Event()
    started = time.monotonic()
    with BundleWriter(io.BytesIO(), ArtifactLimits(max_seconds=0.05)) as writer:
        with pytest.raises(CollectionTimedOut):
            await run_collection(writer, lambda: release.wait(30), grace_s=0.1)
        assert time.monotonic() - started < 10
        release.set()
        with pytest.raises(CollectionTimedOut):  # the reader's next step
            writer.tally()


@pytest.mark.slow
async def test_collection_time_is_charged_to_the_sample(sandbox_config, caplog):
    """Stops: a collection that runs as long as the agent's files make it, with nothing in the
    time account. Past verifier.max_collect_seconds the sample scores 0, over_limit (the
    agent's, not masked); an honest one shows its collection in the `collect` bucket. The
    collection cut short closes its stream: the engine, blocked on an unread archive, could
    not remove the container for 120 s and left it to the reaper."""
    task = find_task("demo/hello-file")

    async def many_files(env) -> AgentOutcome:
        made = await env.exec(
            "printf 'Hello from the terminal!\\n' > /app/greeting.txt && "
            "mkdir -p /app/m && cd /app/m && seq 1 3000 | xargs touch",
            timeout=60,
        )
        assert made.ok, made.stderr
        return AgentOutcome(FinishReason.STOP)

    pool = fresh_sandboxes(sandbox_config)
    try:
        slow = await run_episode(task, many_files, pool, VerifierConfig(max_collect_seconds=0.001))
        fine = await run_episode(task, many_files, pool, VerifierConfig())
    finally:
        await pool.close()
    assert not [r for r in caplog.records if "failed" in r.getMessage()], caplog.text
    assert slow.reward.value == 0.0 and slow.outcome.failure == FailureKind.OVER_LIMIT
    assert "collecting took more than 0.001 s" in (slow.reward.reason or "")
    assert slow.collect_time_s > 0
    assert fine.reward.value == 1.0, fine.reward.reason
    assert 0 < fine.collect_time_s < fine.total_time_s
