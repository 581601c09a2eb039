"""Files taken out of a sandbox, as a bundle the host wrote itself.

Everything inside a sandbox was written by an adversary, so the host never extracts, follows or
trusts it. What leaves a sandbox becomes a *bundle*: a tar that this module writes entry by entry
from checked values (names normalized and relative to the sandbox's `/`, only regular files,
directories and symlinks, modes masked, sizes and counts bounded). Symlinks are recorded as links
and never followed; devices, FIFOs, sockets and hard links are left out, but every entry a
reader meets counts toward the entry limit, whatever its kind, and one collection has a wall-time
bound (ArtifactLimits.max_seconds), checked at every entry and every chunk of content.

Two readers feed a bundle:
- `collect_tree`: the host reads a sandbox's folder directly (local backend), one directory fd at
  a time with O_NOFOLLOW, so no link, rename or swap inside the sandbox can lead it elsewhere;
- `engine_archive.collect_tar_stream`: the engine's archive of a container (docker backend),
  read as a stream of headers, never extracted, with every member checked as above.

Every backend runs its reader through `run_collection`: on threads of its own, never the event
loop's default executor, where docker commands of every sample run (asyncio.to_thread), so slow
collections cannot hold the threads other samples' commands wait for.

A bundle goes back into a sandbox only through the sandbox's own tar (`restore`), where links
resolve inside that sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import io
import os
import posixpath
import shutil
import stat
import tarfile
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO

MAX_DEPTH = 128  # each level holds a folder fd open; deeper trees are refused, not truncated


class ArtifactLimitExceeded(Exception):
    """The sandbox's files pass the size or count limit (the agent's doing, not the host's)."""


class CollectionTimedOut(ArtifactLimitExceeded):
    """Collecting the sandbox's files took longer than ArtifactLimits.max_seconds (what the
    agent left is what took the time)."""


@dataclass(frozen=True)
class ArtifactLimits:
    """Bounds on what one collection may take out of a sandbox."""

    max_bytes: int = 256 * 1024 * 1024
    """Total bytes of file content."""
    max_entries: int = 50_000
    """Entries of every kind together: files, directories, symlinks, hard links, FIFOs,
    devices and sockets (the last three left out of the bundle, but read all the same)."""
    max_seconds: float = 120.0
    """Wall seconds for one collection (every path of one bundle together)."""


def sandbox_relative(path: str) -> str:
    """`/app/x/` -> `app/x`; raises ValueError for anything that is not a plain absolute path."""
    if not path.startswith("/"):
        raise ValueError(f"not an absolute sandbox path: {path!r}")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts) or not parts:
        raise ValueError(f"not a plain sandbox path: {path!r}")
    return "/".join(parts)


class BundleWriter:
    """Writes a bundle from checked entries; raises ArtifactLimitExceeded past its limits."""

    def __init__(self, fileobj: IO[bytes], limits: ArtifactLimits,
                 exclude: Iterable[str] = ()) -> None:
        # Open for the writer's lifetime: __exit__ closes it.
        self._tar = tarfile.open(  # noqa: SIM115
            fileobj=fileobj, mode="w:gz", format=tarfile.PAX_FORMAT, compresslevel=1)
        self.limits = limits
        self.exclude = tuple(exclude)
        self.bytes = 0
        self.entries = 0
        self._names: set[str] = set()
        self.deadline = time.monotonic() + limits.max_seconds
        self._abandoned = False

    def __enter__(self) -> BundleWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if not self._abandoned:  # a reader thread may still hold it: it stops at its next step
            self._tar.close()

    def abandon(self) -> None:
        """Give the bundle up while a reader may still write to it (its thread outlived its
        wait): its next step raises, and the bundle is never closed under it."""
        self._abandoned = True

    def check_time(self) -> None:
        """CollectionTimedOut once the collection is past its deadline (or abandoned)."""
        if self._abandoned or time.monotonic() > self.deadline:
            raise CollectionTimedOut(
                f"collecting took more than {self.limits.max_seconds:g} s")

    def tally(self) -> None:
        """Count one entry a reader met, whatever its kind and whether it goes in the bundle: a
        hard link, FIFO or device costs a reader as much as a file does."""
        self.entries += 1
        if self.entries > self.limits.max_entries:
            raise ArtifactLimitExceeded(f"more than {self.limits.max_entries} files")
        self.check_time()

    def excluded(self, name: str) -> bool:
        """Whether a harbor `exclude` pattern matches the entry's name or its base name."""
        return any(fnmatch.fnmatch(name, p) or fnmatch.fnmatch(posixpath.basename(name), p)
                   for p in self.exclude)

    def _info(self, name: str, kind: bytes, mode: int, mtime: float) -> tarfile.TarInfo:
        self._names.add(name)
        info = tarfile.TarInfo(name)
        info.type = kind
        info.mode = mode & 0o7777 & ~0o6000  # no setuid/setgid bits survive
        info.mtime = max(0, int(mtime))
        return info

    def add_dir(self, name: str, mode: int = 0o755, mtime: float = 0) -> None:
        self.tally()
        if name in self._names:  # overlapping artifact paths: the first wins
            return
        self._tar.addfile(self._info(name, tarfile.DIRTYPE, mode, mtime))

    def add_symlink(self, name: str, target: str, mtime: float = 0) -> None:
        self.tally()
        if name in self._names:  # overlapping artifact paths: the first wins
            return
        if "\0" in target or len(target) > 4096:
            return
        info = self._info(name, tarfile.SYMTYPE, 0o777, mtime)
        info.linkname = target
        self._tar.addfile(info)

    def add_file(self, name: str, source: IO[bytes], size: int, mode: int = 0o644,
                 mtime: float = 0) -> None:
        self.tally()
        if name in self._names:
            return
        if self.bytes + size > self.limits.max_bytes:
            raise ArtifactLimitExceeded(f"more than {self.limits.max_bytes} bytes")
        info = self._info(name, tarfile.REGTYPE, mode, mtime)
        info.size = size
        self.bytes += size
        self._tar.addfile(info, _Exactly(source, size, self.check_time))


class _Exactly(io.RawIOBase):
    """A reader of exactly `size` bytes: short sources are padded with zeros, long ones cut, so
    a file that changes while it is read cannot desynchronize the archive. `check` runs before
    each read (the collection's deadline)."""

    def __init__(self, source: IO[bytes], size: int, check: Callable[[], None]) -> None:
        self._source, self._left, self._check = source, size, check

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        self._check()
        n = self._left if n is None or n < 0 else min(n, self._left)
        data = self._source.read(n) if n else b""
        data = data + b"\0" * (n - len(data))
        self._left -= len(data)
        return data


# ---- where collections run ----------------------------------------------------------------------
COLLECT_THREADS = 128
"""Threads for collections, apart from the default executor; more than any run's concurrent
samples, so a collection never waits for one (its deadline runs from the writer's creation)."""
GRACE_S = 10.0
"""How long past its deadline a collection is waited for when it blocks where it cannot check
the time (a read from an engine that stopped sending) before it is given up."""
_threads: ThreadPoolExecutor | None = None


async def run_collection[T](writer: BundleWriter, read: Callable[[], T],
                            grace_s: float = GRACE_S) -> T:
    """`read` (a blocking reader into `writer`) on the collections' own threads, within the
    writer's deadline: the reader checks it at every entry and chunk; one blocked elsewhere is
    given up `grace_s` after it (CollectionTimedOut), and at once when our caller is
    cancelled. A reader given up is abandoned with its writer: its next step raises, and
    nothing is closed under it."""
    global _threads
    if _threads is None:
        _threads = ThreadPoolExecutor(COLLECT_THREADS, thread_name_prefix="skyrl-collect")
    reading = asyncio.get_running_loop().run_in_executor(_threads, read)
    try:
        return await asyncio.wait_for(reading, max(0.0, writer.deadline - time.monotonic())
                                      + grace_s)
    except BaseException as exc:
        if reading.done() and not reading.cancelled():
            raise  # the reader's own outcome
        writer.abandon()  # timed out, or our caller was cancelled: the thread may read on
        if isinstance(exc, TimeoutError):
            raise CollectionTimedOut(
                f"collecting took more than {writer.limits.max_seconds:g} s") from None
        raise


# ---- the host reads a sandbox folder (local backend) -------------------------------------------
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


def _open_parent(root_fd: int, parts: list[str]) -> int | None:
    """An fd of the folder holding parts[-1], walked without following links; None if absent."""
    fd = os.dup(root_fd)
    try:
        for part in parts[:-1]:
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError:  # missing, not a folder, or a link (O_NOFOLLOW)
                return None
            os.close(fd)
            fd = child
        result, fd = fd, -1
        return result
    finally:
        if fd >= 0:
            os.close(fd)


@contextlib.contextmanager
def _parent_folder(root: Path, parts: list[str]) -> Iterator[int | None]:
    """An fd of the folder holding parts[-1] under the host folder `root` (the sandbox's `/`),
    walked as _open_parent does, closed after the block; None if there is none."""
    root_fd = os.open(root, _DIR_FLAGS)
    try:
        parent = _open_parent(root_fd, parts)
    finally:
        os.close(root_fd)
    try:
        yield parent
    finally:
        if parent is not None:
            os.close(parent)


def collect_tree(root: Path, remote: str, writer: BundleWriter) -> bool:
    """Add the sandbox path `remote` (under the host folder `root`, the sandbox's `/`) to the
    bundle; False when it does not exist. Links are recorded, never followed."""
    name = sandbox_relative(remote)
    with _parent_folder(root, name.split("/")) as parent:
        return parent is not None and _add_entry(parent, name.split("/")[-1], name, writer, 0)


def _add_entry(dir_fd: int, base: str, name: str, writer: BundleWriter, depth: int) -> bool:
    if depth > MAX_DEPTH:
        raise ArtifactLimitExceeded(f"folders nested deeper than {MAX_DEPTH} levels")
    try:
        st = os.stat(base, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if writer.excluded(name):
        return True
    if stat.S_ISLNK(st.st_mode):
        writer.add_symlink(name, os.readlink(base, dir_fd=dir_fd), st.st_mtime)
    elif stat.S_ISREG(st.st_mode):
        _add_file(dir_fd, base, name, writer)
    elif stat.S_ISDIR(st.st_mode):
        writer.add_dir(name, st.st_mode, st.st_mtime)
        try:
            fd = os.open(base, _DIR_FLAGS, dir_fd=dir_fd)
        except OSError:
            return True
        try:
            for child in _children(fd, name, writer):
                _add_entry(fd, child, f"{name}/{child}", writer, depth + 1)
        finally:
            os.close(fd)
    else:  # devices, FIFOs and sockets are left out, and counted
        writer.tally()
    return True


def _children(fd: int, name: str, writer: BundleWriter) -> list[str]:
    """The names in a folder, sorted; ArtifactLimitExceeded as soon as more are listed than the
    entry limit leaves (a folder of millions is not read whole first). Excluded names do not
    count: they are never read."""
    room = writer.limits.max_entries - writer.entries
    names: list[str] = []
    try:
        with os.scandir(fd) as listing:
            for entry in listing:
                if writer.excluded(f"{name}/{entry.name}"):
                    continue
                names.append(entry.name)
                if len(names) > room:
                    raise ArtifactLimitExceeded(f"more than {writer.limits.max_entries} files")
                if len(names) % 1024 == 0:
                    writer.check_time()
    except OSError:  # unreadable to a host that is not root
        return []
    return sorted(names)


def _add_file(dir_fd: int, base: str, name: str, writer: BundleWriter) -> None:
    try:
        fd = os.open(base, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError:
        writer.tally()
        return
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(handle.fileno())
        if not stat.S_ISREG(st.st_mode):  # swapped between stat and open
            writer.tally()
            return
        writer.add_file(name, handle, st.st_size, st.st_mode, st.st_mtime)


def read_tree_file(root: Path, remote: str, limit: int) -> bytes | None:
    """The content of a regular file at `remote` under `root`, links not followed; None when it
    is missing or not a regular file. Raises ArtifactLimitExceeded past `limit` bytes."""
    parts = sandbox_relative(remote).split("/")
    with _parent_folder(root, parts) as parent:
        if parent is None:
            return None
        try:
            fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=parent)
        except OSError:
            return None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            return None
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise ArtifactLimitExceeded(f"{remote} holds more than {limit} bytes")
    return data


def remove_tree_path(root: Path, remote: str) -> bool:
    """Delete the sandbox path `remote` under `root` as `rm -rf` inside would (a link itself,
    not what it points to), the folders on the way walked without following links. False when
    it cannot be done so (`/`, a folder on the way missing or a link, an error): the caller
    deletes it inside the sandbox then, where links resolve as the sandbox sees them."""
    try:
        parts = sandbox_relative(remote).split("/")
    except ValueError:
        return False
    with _parent_folder(root, parts) as parent:
        if parent is None:
            return False
        try:
            st = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(parts[-1], dir_fd=parent)
            else:
                os.unlink(parts[-1], dir_fd=parent)
        except FileNotFoundError:
            return True
        except OSError:
            return False
    return True


def bundle_names(bundle: bytes) -> list[str]:
    """The entry names of a bundle (this module wrote it, so reading it back is safe)."""
    with tarfile.open(fileobj=io.BytesIO(bundle), mode="r:gz") as archive:
        return archive.getnames()
