"""Atomic writes of files and folders: a reader, a killed writer or a power loss finds the old
target (or none) or the complete new one, never part of one. Every writer in the project that
publishes a file or folder goes through here.

Guarantees, for every function below:
- Staging: the new content is written beside the target (same folder, so the same filesystem
  and the rename is atomic), under `staging_path(target)`: `.{name}.staging-{host}-{pid}-{rand}`.
- Durability: before the rename the data of every file written is fsynced (for a folder, every
  file and sub-folder in it); after it, the parent folder is, so once the call returns the new
  target survives a power loss, not only a killed process.
- Failure: an exception while writing removes the staging and leaves the target untouched.
- Clean-up: a writer killed mid-way leaves only its staging. The next write of the same target
  removes every staging of it whose writer process (on this host) is gone; `clean_stale_staging`
  sweeps a whole folder. A live writer's staging is never touched.
- Races: files, last writer wins (`os.replace`). Folders, first writer wins by default: a second
  writer finds the target present and discards its staging (right for content-addressed caches,
  where both wrote the same thing). With `replace=True` the last writer wins: the old folder is
  renamed aside and then removed, so for an instant there is no target (a crash then leaves the
  old folder as a stale staging, removed by the next clean-up).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import secrets
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

MARK = ".staging-"
"""In every staging name, between the target's name and the writer's host, pid and nonce."""


def _host() -> str:
    # Short tag of this host: a pid only says whether a writer lives on the host that wrote it.
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def staging_path(target: Path, pid: int | None = None) -> Path:
    """Where the process `pid` (default: this one) stages a new `target`."""
    pid = os.getpid() if pid is None else pid
    return target.with_name(f".{target.name}{MARK}{_host()}-{pid}-{secrets.token_hex(4)}")


def _writer_gone(staging: Path) -> bool:
    host, pid, _ = staging.name.rsplit(MARK, 1)[1].split("-")
    if host != _host() or not pid.isdigit():
        return False  # another host's writer: we cannot tell, so leave it
    if int(pid) == os.getpid():
        return False  # another thread of this process may be writing it
    return not process_alive(int(pid))


def process_alive(pid: int) -> bool:
    """Whether a process `pid` exists on this host (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def clean_stale_staging(folder: Path, name: str = "*") -> list[Path]:
    """Remove the stagings in `folder` left by writers that died, of the targets whose names
    match the glob pattern `name` (default: all); returns what was removed."""
    removed = []
    for staging in Path(folder).glob(f".{name}{MARK}*-*-*"):  # `name` is a glob pattern
        with contextlib.suppress(ValueError):  # a name that only looks like ours
            if _writer_gone(staging):
                _remove(staging)
                removed.append(staging)
    return removed


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for folder, _, files in os.walk(root):  # links are not followed
        for name in files:
            if not os.path.islink(os.path.join(folder, name)):
                _fsync(Path(folder, name))
        _fsync(Path(folder))


def _prepare(target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_staging(target.parent, glob.escape(target.name))
    return staging_path(target)


@contextlib.contextmanager
def atomic_file(target: Path, mode: int = 0o666) -> Iterator[Path]:
    """Yield an empty staging file (created with permission bits `mode`, less the umask) for
    the caller to write by name; on success it replaces `target`. Last writer wins."""
    target = Path(target)
    staging = _prepare(target)
    os.close(os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode))
    try:
        yield staging
        _fsync(staging)
        os.replace(staging, target)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise
    _fsync(target.parent)


def atomic_write_bytes(target: Path, data: bytes, mode: int = 0o666) -> Path:
    """Replace `target` by `data`, atomically and durably. Last writer wins."""
    with atomic_file(target, mode) as staging:
        staging.write_bytes(data)
    return Path(target)


def atomic_write_text(target: Path, text: str, mode: int = 0o666) -> Path:
    """Replace `target` by `text` (UTF-8), atomically and durably. Last writer wins."""
    return atomic_write_bytes(target, text.encode(), mode)


@contextlib.contextmanager
def atomic_folder(target: Path, replace: bool = False) -> Iterator[Path]:
    """Yield an empty staging folder for the caller to fill; on success it becomes `target`.
    First writer wins (a present target is kept, the staging discarded) unless `replace`."""
    target = Path(target)
    staging = _prepare(target)
    staging.mkdir()
    try:
        yield staging
        _fsync_tree(staging)
        _publish(staging, target, replace)
    finally:
        _remove(staging)  # gone after a publish; the loser's or a failed writer's otherwise
    _fsync(target.parent)


def _publish(staging: Path, target: Path, replace: bool) -> None:
    if replace and (target.exists() or target.is_symlink()):
        old = staging_path(target)
        os.replace(target, old)
        os.replace(staging, target)
        _remove(old)
        return
    try:
        os.rename(staging, target)  # fails on a present, non-empty folder: the first won
    except OSError:
        if not target.exists():
            raise  # a real failure, not a concurrent writer's win
