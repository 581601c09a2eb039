"""The engine's archive of a container (docker backend), read as a stream of headers, never
extracted: each member checked and copied into a host-written bundle (artifacts.BundleWriter).

The archive lists what an adversary left, so reading it must cost time linear in its size:
links and excluded folders are held in a tree of path components (PrefixSet), every member
counts toward the entry limit whatever its kind, and the collection's deadline is checked at
every member and every chunk.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from skyrl_agent.sandboxes.artifacts import (
    MAX_DEPTH,
    ArtifactLimitExceeded,
    BundleWriter,
    sandbox_relative,
)

_CHUNK = 1 << 20


class BoundedStream(io.RawIOBase):
    """A file-like view of byte chunks that refuses to yield more than `limit` bytes; `check`
    runs before each chunk is taken (a collection's deadline)."""

    def __init__(
        self, chunks: Iterable[bytes], limit: int, check: Callable[[], None] = lambda: None
    ) -> None:
        self._chunks: Iterator[bytes] = iter(chunks)
        self._buffer = memoryview(b"")  # a view: taking from its front copies nothing
        self._left = limit
        self._check = check

    def readable(self) -> bool:
        return True

    def readinto(self, target) -> int:
        while not self._buffer:
            self._check()
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._left -= len(chunk)
            if self._left < 0:
                raise ArtifactLimitExceeded("the archive passes the transfer limit")
            self._buffer = memoryview(chunk)
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


_Node = dict[str, Any]  # component -> subtree, or True where a held path ends


class PrefixSet:
    """Paths whose contents are left out (links, excluded folders), held as a tree of their
    components: whether a name lies under one costs one look-up per component of the name,
    however many paths are held. (A list compared with each member made collection quadratic:
    1,500 symlinks listed before 30,000 hard links took 45 M comparisons.)"""

    def __init__(self) -> None:
        self._root: _Node = {}
        self.lookups = 0
        """Look-ups made by `covers`, counted so a test can hold the cost to the names' length."""

    def add(self, name: str) -> None:
        node = self._root
        *folders, last = name.split("/")
        for part in folders:
            child = node.setdefault(part, {})
            if child is True:  # already under a held path
                return
            node = child
        node[last] = True

    def covers(self, name: str) -> bool:
        """Whether `name` lies strictly under a held path (a held path is not under itself)."""
        node = self._root
        for part in name.split("/")[:-1]:
            self.lookups += 1
            child = node.get(part)
            if child is None:
                return False
            if child is True:
                return True
            node = child
        return False


def collect_tar_stream(chunks: Iterable[bytes], remote: str, writer: BundleWriter) -> None:
    """Copy the members of an archive whose top entry is the base name of `remote` into the
    bundle, checking each; nothing is written to the host's file system. Every member counts
    toward the entry limit (hard links, FIFOs and devices too, though left out), except what a
    task's `exclude` drops; each costs time linear in its name's length."""
    top = sandbox_relative(remote)
    stream = io.BufferedReader(
        BoundedStream(chunks, writer.limits.max_bytes * 2 + _CHUNK, writer.check_time)
    )
    left_out = PrefixSet()
    seen: set[str] = set()
    with tarfile.open(fileobj=stream, mode="r|") as archive:
        for member in archive:
            name = checked_member_name(member.name, top)
            if name is None or name in seen:  # outside the path, or listed twice
                writer.tally()
                continue
            if name.count("/") - top.count("/") > MAX_DEPTH:  # as collect_tree refuses them
                raise ArtifactLimitExceeded(f"folders nested deeper than {MAX_DEPTH} levels")
            if left_out.covers(name):
                # Under an excluded folder (the task asked to drop it: not counted), or listed
                # "through" a link (never a path of the sandbox's own).
                writer.check_time()
                continue
            if writer.excluded(name):
                left_out.add(name)  # an excluded folder goes with everything in it
                writer.check_time()
                continue
            seen.add(name)
            if member.isdir():
                writer.add_dir(name, member.mode, member.mtime)
            elif member.issym():
                left_out.add(name)
                writer.add_symlink(name, member.linkname, member.mtime)
            elif member.isreg():
                source = archive.extractfile(member)
                assert source is not None
                writer.add_file(name, source, member.size, member.mode, member.mtime)
            else:  # hard links, FIFOs, devices: left out, and counted
                writer.tally()


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
