"""Files taken out of a sandbox, as a bundle the host wrote itself.

Everything inside a sandbox was written by an adversary, so the host never extracts, follows or
trusts it. What leaves a sandbox becomes a *bundle*: a tar that this module writes entry by entry
from checked values (names normalized and relative to the sandbox's `/`, only regular files,
directories and symlinks, modes masked, sizes and counts bounded). Symlinks are recorded as links
and never followed; devices, FIFOs, sockets and hard links are left out.

Two readers feed a bundle:
- `collect_tree`: the host reads a sandbox's folder directly (local backend), one directory fd at
  a time with O_NOFOLLOW, so no link, rename or swap inside the sandbox can lead it elsewhere;
- `collect_tar_stream`: the engine's archive of a container (docker backend), read as a stream
  of headers, never extracted, with every member checked as above.

A bundle goes back into a sandbox only through the sandbox's own tar (`restore`), where links
resolve inside that sandbox.
"""

from __future__ import annotations

import contextlib
import fnmatch
import io
import os
import posixpath
import shutil
import stat
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

_CHUNK = 1 << 20
MAX_DEPTH = 128  # each level holds a folder fd open; deeper trees are refused, not truncated


class ArtifactLimitExceeded(Exception):
    """The sandbox's files pass the size or count limit (the agent's doing, not the host's)."""


@dataclass(frozen=True)
class ArtifactLimits:
    """Bounds on what one collection may take out of a sandbox."""

    max_bytes: int = 256 * 1024 * 1024
    """Total bytes of file content."""
    max_entries: int = 50_000
    """Files, directories and links together."""


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

    def __enter__(self) -> BundleWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._tar.close()

    def excluded(self, name: str) -> bool:
        """Whether a harbor `exclude` pattern matches the entry's name or its base name."""
        return any(fnmatch.fnmatch(name, p) or fnmatch.fnmatch(posixpath.basename(name), p)
                   for p in self.exclude)

    def _info(self, name: str, kind: bytes, mode: int, mtime: float) -> tarfile.TarInfo:
        self.entries += 1
        if self.entries > self.limits.max_entries:
            raise ArtifactLimitExceeded(f"more than {self.limits.max_entries} files")
        self._names.add(name)
        info = tarfile.TarInfo(name)
        info.type = kind
        info.mode = mode & 0o7777 & ~0o6000  # no setuid/setgid bits survive
        info.mtime = max(0, int(mtime))
        return info

    def add_dir(self, name: str, mode: int = 0o755, mtime: float = 0) -> None:
        if name in self._names:  # overlapping artifact paths: the first wins
            return
        self._tar.addfile(self._info(name, tarfile.DIRTYPE, mode, mtime))

    def add_symlink(self, name: str, target: str, mtime: float = 0) -> None:
        if name in self._names:  # overlapping artifact paths: the first wins
            return
        if "\0" in target or len(target) > 4096:
            return
        info = self._info(name, tarfile.SYMTYPE, 0o777, mtime)
        info.linkname = target
        self._tar.addfile(info)

    def add_file(self, name: str, source: IO[bytes], size: int, mode: int = 0o644,
                 mtime: float = 0) -> None:
        if name in self._names:
            return
        if self.bytes + size > self.limits.max_bytes:
            raise ArtifactLimitExceeded(f"more than {self.limits.max_bytes} bytes")
        info = self._info(name, tarfile.REGTYPE, mode, mtime)
        info.size = size
        self.bytes += size
        self._tar.addfile(info, _Exactly(source, size))


class _Exactly(io.RawIOBase):
    """A reader of exactly `size` bytes: short sources are padded with zeros, long ones cut, so
    a file that changes while it is read cannot desynchronize the archive."""

    def __init__(self, source: IO[bytes], size: int) -> None:
        self._source, self._left = source, size

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = self._left if n is None or n < 0 else min(n, self._left)
        data = self._source.read(n) if n else b""
        data = data + b"\0" * (n - len(data))
        self._left -= len(data)
        return data


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
            try:
                children = sorted(os.listdir(fd))
            except OSError:  # unreadable to a host that is not root
                children = []
            for child in children:
                _add_entry(fd, child, f"{name}/{child}", writer, depth + 1)
        finally:
            os.close(fd)
    return True  # devices, FIFOs and sockets are left out


def _add_file(dir_fd: int, base: str, name: str, writer: BundleWriter) -> None:
    try:
        fd = os.open(base, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError:
        return
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(handle.fileno())
        if not stat.S_ISREG(st.st_mode):  # swapped between stat and open
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


# ---- the engine's archive of a container (docker backend) --------------------------------------
class BoundedStream(io.RawIOBase):
    """A file-like view of byte chunks that refuses to yield more than `limit` bytes."""

    def __init__(self, chunks: Iterable[bytes], limit: int) -> None:
        self._chunks: Iterator[bytes] = iter(chunks)
        self._buffer = b""
        self._left = limit

    def readable(self) -> bool:
        return True

    def readinto(self, target) -> int:
        while not self._buffer:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._left -= len(chunk)
            if self._left < 0:
                raise ArtifactLimitExceeded("the archive passes the transfer limit")
            self._buffer = chunk
        n = min(len(target), len(self._buffer))
        target[:n] = self._buffer[:n]
        self._buffer = self._buffer[n:]
        return n


def checked_member_name(member: str, top: str) -> str | None:
    """The bundle name of an archive member listed under `top` (the sandbox path's relative
    form), or None when the name is not plainly inside it."""
    parts = [p for p in member.split("/") if p not in ("", ".")]
    if not parts or any(p == ".." for p in parts) or member.startswith("/"):
        return None
    base = top.rsplit("/", 1)[0] if "/" in top else ""
    name = "/".join(([base] if base else []) + parts)
    return name if name == top or name.startswith(top + "/") else None


def collect_tar_stream(chunks: Iterable[bytes], remote: str, writer: BundleWriter) -> None:
    """Copy the members of an archive whose top entry is the base name of `remote` into the
    bundle, checking each; nothing is written to the host's file system."""
    top = sandbox_relative(remote)
    stream = io.BufferedReader(BoundedStream(chunks, writer.limits.max_bytes * 2 + _CHUNK))
    links: list[str] = []
    skipped: list[str] = []
    seen: set[str] = set()
    with tarfile.open(fileobj=stream, mode="r|") as archive:
        for member in archive:
            name = checked_member_name(member.name, top)
            if name is None or name in seen:
                continue
            if any(name.startswith(folder + "/") for folder in skipped):
                continue  # an excluded folder goes with everything in it
            if writer.excluded(name):
                skipped.append(name)
                continue
            if any(name.startswith(link + "/") for link in links):
                continue  # listed "through" a link: never a path of the sandbox's own
            seen.add(name)
            if member.isdir():
                writer.add_dir(name, member.mode, member.mtime)
            elif member.issym():
                links.append(name)
                writer.add_symlink(name, member.linkname, member.mtime)
            elif member.isreg():
                source = archive.extractfile(member)
                assert source is not None
                writer.add_file(name, source, member.size, member.mode, member.mtime)


def read_tar_file(chunks: Iterable[bytes], remote: str, limit: int) -> bytes | None:
    """The content of `remote` from an engine archive when it is a regular file, else None."""
    top = sandbox_relative(remote).rsplit("/", 1)[-1]
    stream = io.BufferedReader(BoundedStream(chunks, limit + 64 * 1024))
    with tarfile.open(fileobj=stream, mode="r|") as archive:
        for member in archive:
            if member.name == top and member.isreg():
                if member.size > limit:
                    raise ArtifactLimitExceeded(f"{remote} holds more than {limit} bytes")
                source = archive.extractfile(member)
                assert source is not None
                return source.read()
            return None
    return None


def bundle_names(bundle: bytes) -> list[str]:
    """The entry names of a bundle (this module wrote it, so reading it back is safe)."""
    with tarfile.open(fileobj=io.BytesIO(bundle), mode="r:gz") as archive:
        return archive.getnames()
