"""The agent's final working directory, kept beside the trajectory so it can be re-graded.

Captured after the agent stops and before the tests are copied in; restored into a fresh sandbox
of the same task by `skyrl-agent eval --regrade`. Only the task's working directory is kept
(for repository tasks that is the repository, i.e. the patch and everything around it).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import tarfile
import tempfile
from pathlib import Path

from skyrl_agent.envs.env import Env

MAX_STATE_BYTES = 64 * 1024 * 1024


def sample_stem(task_id: str, sample_index: int) -> str:
    """A file name for one sample: `demo/hello-file`, 3 -> `demo__hello-file#3`."""
    return f"{task_id.replace('/', '__')}#{sample_index}"


def state_path(run_dir: Path, task_id: str, sample_index: int) -> Path:
    return run_dir / "final_state" / f"{sample_stem(task_id, sample_index)}.tar.gz"


async def capture(env: Env, destination: Path, limit_bytes: int = MAX_STATE_BYTES) -> str | None:
    """Save the workdir as a .tar.gz (atomically); returns why not, when it was not saved."""
    workdir = env.workdir
    if workdir in ("/", ""):
        return "the task has no working directory of its own"
    size = await env.exec(f"du -sb {shlex.quote(workdir)} | cut -f1", timeout=60)
    if size.exit_code != 0 or not size.stdout.strip().isdigit():
        return f"cannot measure {workdir}"
    if int(size.stdout) > limit_bytes:
        return f"{workdir} holds {int(size.stdout)} bytes, over the {limit_bytes} limit"
    destination.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        local = Path(scratch) / "state"
        await env.download(workdir, local)
        await asyncio.to_thread(_pack, local, destination)  # gzip must not stall other rollouts
    return None


def _pack(folder: Path, destination: Path) -> None:
    tmp = destination.with_name(f".{destination.name}.tmp")
    with tarfile.open(tmp, "w:gz") as archive:
        archive.add(folder, arcname=".")
    os.replace(tmp, destination)


def _unpack(archive: Path, folder: Path) -> None:
    with tarfile.open(archive) as tar:
        tar.extractall(folder, filter="data")


async def restore(env: Env, archive: Path) -> None:
    """Replace the workdir of a fresh sandbox with the saved one."""
    workdir = shlex.quote(env.workdir)
    await env.exec(f"find {workdir} -mindepth 1 -delete", timeout=120)
    with tempfile.TemporaryDirectory() as scratch:
        local = Path(scratch) / "state"
        await asyncio.to_thread(_unpack, archive, local)
        await env.upload(local, env.workdir)
