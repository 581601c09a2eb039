"""The warm pool hands out started, pristine sandboxes and refills itself."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from skyrl_agent.config import SandboxConfig
from skyrl_agent.sandboxes.base import SandboxSpec
from skyrl_agent.sandboxes.pool import SandboxPool
from skyrl_agent.tasks import find_task


async def test_pool_hits_refills_and_closes(backend):
    config = SandboxConfig(backend=backend, warm_pool=2)
    spec = SandboxSpec.from_task(find_task("demo/word-count"), config)
    pool = SandboxPool(config, size=2)
    await pool.warm(spec)
    first = await pool.acquire(spec)
    assert pool.hits == 1 and pool.misses == 0
    result = await first.exec("cat /app/story.txt | wc -w && touch /app/used", timeout=30)
    assert result.ok and int(result.stdout) > 0
    second = await pool.acquire(spec)
    fresh = await second.exec("test -e /app/used && echo dirty || echo clean", timeout=30)
    assert fresh.stdout.strip() == "clean"  # never a sandbox someone already used
    for _ in range(300):  # refill runs in the background (slow on a loaded machine)
        if len(pool._idle[spec.environment_key()]) == 2:
            break
        await asyncio.sleep(0.1)
    assert len(pool._idle[spec.environment_key()]) == 2
    idle = [s for s, _ in pool._idle[spec.environment_key()]]
    await pool.close()
    await first.stop()
    await second.stop()
    for sandbox in idle:
        assert (await _is_stopped(sandbox))


async def _is_stopped(sandbox) -> bool:
    try:
        await sandbox.exec("true", timeout=5)
    except Exception:  # noqa: BLE001 - any failure means it no longer runs commands
        return True
    return False


async def test_concurrent_acquires_never_overfill(backend):
    """Refills scheduled by concurrent acquires each see room; the pool still holds at most
    `size` idle sandboxes (3 of 2 were seen on a loaded machine before starts were counted)."""
    config = SandboxConfig(backend=backend, warm_pool=2)
    spec = SandboxSpec.from_task(find_task("demo/word-count"), config)
    pool = SandboxPool(config, size=2)
    taken = await asyncio.gather(*(pool.acquire(spec) for _ in range(4)))
    key = spec.environment_key()
    for _ in range(300):
        if not pool._refills:
            break
        await asyncio.sleep(0.05)
    assert len(pool._idle[key]) == 2
    await pool.close()
    await asyncio.gather(*(s.stop() for s in taken))


async def test_stop_leaves_no_folder_and_no_cgroup(work_root):
    """A stopped local sandbox leaves nothing behind: no folder, no mounted disk, no cgroup."""
    from skyrl_agent.sandboxes.cgroups import CGROUP_ROOT, CONTROLLERS, PARENT

    config = SandboxConfig(backend="local", work_root=work_root)
    spec = SandboxSpec.from_task(find_task("demo/word-count"), config)
    pool = SandboxPool(config, size=0)
    sandbox = await pool.acquire(spec)
    try:  # a process still running at stop() must not keep the cgroup busy
        assert (await sandbox.exec("sleep 30 >/dev/null 2>&1 &", timeout=30)).ok
    finally:
        await sandbox.stop()
    assert list(work_root.iterdir()) == []
    assert not [c for c in CONTROLLERS if (CGROUP_ROOT / c / PARENT / sandbox.id).exists()]


def test_the_environment_key_follows_every_change_of_the_tree_and_reads_it_once(
        tmp_path, monkeypatch):
    """The key is reused while the tree's files keep their inode, size and change time; a
    write shows even when it keeps the size and puts the modification time back."""
    environment = tmp_path / "environment"
    (environment / "conf").mkdir(parents=True)
    (environment / "Dockerfile").write_text("FROM scratch\n")
    settings = environment / "conf" / "settings.ini"
    settings.write_text("mode=a\n")
    spec = SandboxSpec(name="t", environment_dir=environment)
    key = spec.environment_key()
    reads: list[str] = []
    real = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda path: reads.append(path.name) or real(path))
    assert spec.environment_key() == key and reads == []  # unchanged: nothing read again
    stat = settings.stat()
    settings.write_text("mode=b\n")
    os.utime(settings, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    changed = spec.environment_key()
    assert changed != key and reads
    (environment / "conf" / "extra").write_text("")
    assert spec.environment_key() not in (key, changed)
    settings.write_text("mode=a\n")
    (environment / "conf" / "extra").unlink()
    assert spec.environment_key() == key  # the same content: the same key
