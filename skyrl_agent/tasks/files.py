"""Reading a task's files on the host: one way, for every reader.

A task folder may come from anywhere (a downloaded set, a generated one, a colleague's), and what
the host reads from it goes to a model, into a sandbox or into an image build. A name inside
the folder proves nothing about the bytes behind it: a symlink may point anywhere, and a hard
link inside the folder *is* the file outside it (the same inode), so "the resolved path lies in
the task folder" passed a hard link to a host file, and its bytes reached the model as an
instruction image (issue 54). So every task file is read here:

- `read_task_file` walks the path from the task folder one component at a time with O_NOFOLLOW
  (no symlink anywhere on the way, no `..`, nothing absolute), takes only a regular file that
  is its only name (st_nlink == 1), bounds its size, and verifies its bytes for their kind
  (text: UTF-8; image: PNG or JPEG that decodes within the vision bounds);
- `check_task_tree` holds the whole folder to the same rules when the task loads (no symlink,
  no hard link, no FIFO, device or socket), so every reader that copies a folder (Harbor's
  trial, a local sandbox's COPY) sees plain files only;
- `pack_task_folder` / `copy_task_folder` carry tests/, solution/ and environment/ into a
  sandbox or an image build from the same walk, trusting nothing checked earlier.

Each refusal is a TaskError of one line naming the file and the rule.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Literal

from skyrl_agent.errors import TaskError

FileKind = Literal["bytes", "text", "image"]
MAX_TEXT_BYTES = 4 << 20
"""task.toml, instruction.md, a Dockerfile, solve.sh."""
MAX_TREE_ENTRIES = 200_000
MAX_TREE_DEPTH = 64
MAX_FOLDER_BYTES = 4 << 30
"""One folder carried into a sandbox or a build (SWE environments hold a repository stream)."""
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_CHUNK = 1 << 20


def _refused(task_dir: Path, rel: str, why: str) -> TaskError:
    return TaskError(f"task file {rel} in {task_dir} {why}")


def _kind_of(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "is a symbolic link: a task's files must be plain files (copy the file in instead)"
    if stat.S_ISDIR(mode):
        return "is a folder, not a file"
    if stat.S_ISFIFO(mode):
        return "is a FIFO, not a regular file"
    if stat.S_ISSOCK(mode):
        return "is a socket, not a regular file"
    return "is a device, not a regular file"


def _hard_link(links: int) -> str:
    return (
        f"is a hard link ({links} names for one file, which may lie outside the task "
        "folder): copy the file in instead"
    )


def _parts(task_dir: Path, rel: str) -> list[str]:
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if rel.startswith("/") or not parts or ".." in parts or "\0" in rel:
        raise _refused(task_dir, rel, "is not a path inside the task folder")
    return parts


def _open_folder(task_dir: Path, rel: str, parts: list[str]) -> int:
    """An fd of the folder `parts` under the task folder, each step taken without following a
    link (a link on the way is named in the error)."""
    try:
        fd = os.open(task_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise TaskError(f"task folder {task_dir} cannot be read: {exc.strerror}") from None
    for at, part in enumerate(parts):
        try:
            child = os.open(part, _DIR, dir_fd=fd)
        except OSError as exc:
            where = "/".join(parts[: at + 1])
            why = _why_not(fd, part, exc)
            os.close(fd)
            raise _refused(
                task_dir, rel, why if where == rel else f"lies under {where}, which {why}"
            ) from None
        os.close(fd)
        fd = child
    return fd


def _why_not(dir_fd: int, name: str, exc: OSError) -> str:
    """Why `name` could not be opened as wanted, in words."""
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return "does not exist"
    except OSError:
        return f"cannot be read ({exc.strerror})"
    if stat.S_ISDIR(mode) and not stat.S_ISLNK(mode):
        return f"cannot be read ({exc.strerror})"
    return _kind_of(mode)


def open_task_file(task_dir: Path, rel: str) -> IO[bytes]:
    """The task file `rel` (a path under `task_dir`), opened as `read_task_file` describes:
    TaskError unless it is a regular file, its only name, reached through no link."""
    parts = _parts(task_dir, rel)
    folder = _open_folder(task_dir, rel, parts[:-1])
    try:
        try:
            fd = os.open(parts[-1], _FILE, dir_fd=folder)
        except OSError as exc:
            raise _refused(task_dir, rel, _why_not(folder, parts[-1], exc)) from None
    finally:
        os.close(folder)
    handle = os.fdopen(fd, "rb")
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        handle.close()
        raise _refused(
            task_dir,
            rel,
            _hard_link(st.st_nlink) if stat.S_ISREG(st.st_mode) else _kind_of(st.st_mode),
        )
    return handle


def read_task_file(task_dir: Path, rel: str, max_bytes: int, kind: FileKind = "bytes") -> bytes:
    """The bytes of the task file `rel`, verified for `kind`; TaskError (one line) for a
    symlink anywhere on its path, a hard link, anything but a regular file, a path out of the
    task folder, more than `max_bytes`, or bytes that are not what `kind` says."""
    with open_task_file(task_dir, rel) as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise _refused(task_dir, rel, f"is larger than {max_bytes} bytes")
    if kind == "text":
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _refused(task_dir, rel, f"is not UTF-8 text (byte {exc.start})") from None
    elif kind == "image":
        from skyrl_agent.images import ImageError, decode_image

        try:
            decode_image(data)
        except ImageError as exc:
            raise _refused(task_dir, rel, f"is not a PNG or JPEG image we show ({exc})") from None
    return data


def read_task_text(task_dir: Path, rel: str, max_bytes: int = MAX_TEXT_BYTES) -> str:
    """The task file `rel` as text (read_task_file's rules)."""
    return read_task_file(task_dir, rel, max_bytes, "text").decode("utf-8")


def check_task_tree(task_dir: Path) -> None:
    """TaskError for the first entry of the task folder that is not a plain file or folder: a
    symlink, a hard link, a FIFO, device or socket (and for a tree past its bounds)."""
    for seen, (rel, st) in enumerate(_walk_lstat(task_dir, "", 0), 1):
        if seen > MAX_TREE_ENTRIES:
            raise TaskError(f"task folder {task_dir} holds more than {MAX_TREE_ENTRIES} entries")
        if stat.S_ISREG(st.st_mode):
            if st.st_nlink != 1:
                raise _refused(task_dir, rel, _hard_link(st.st_nlink))
        elif not stat.S_ISDIR(st.st_mode):
            raise _refused(task_dir, rel, _kind_of(st.st_mode))


def _walk_lstat(root: Path, rel: str, depth: int) -> Iterator[tuple[str, os.stat_result]]:
    if depth > MAX_TREE_DEPTH:
        raise TaskError(f"task folder {root} nests deeper than {MAX_TREE_DEPTH} levels")
    try:
        with os.scandir(root / rel if rel else root) as listing:
            entries = sorted(listing, key=lambda e: e.name)
    except OSError as exc:
        raise TaskError(
            f"task folder {root}: {rel or '.'} cannot be read: {exc.strerror}"
        ) from None
    for entry in entries:
        child = f"{rel}/{entry.name}" if rel else entry.name
        st = entry.stat(follow_symlinks=False)
        yield child, st
        if stat.S_ISDIR(st.st_mode):
            yield from _walk_lstat(root, child, depth + 1)


# ---- whole folders, carried into a sandbox or an image build -----------------------------------
class _Folder:
    """The plain files and folders under one folder of a task, walked through folder fds with
    O_NOFOLLOW, each file checked as read_task_file checks it; bounded in entries and bytes."""

    def __init__(self, task_dir: Path, rel: str) -> None:
        self.task_dir, self.rel = task_dir, rel
        self.entries = 0
        self.bytes = 0

    def walk(self) -> Iterator[tuple[str, os.stat_result, IO[bytes] | None]]:
        """(path under the folder, its stat, an open file or None for a folder), parents
        first; "" is the folder itself."""
        fd = _open_folder(self.task_dir, self.rel, _parts(self.task_dir, self.rel))
        try:
            yield from self._walk(fd, "", 0)
        finally:
            os.close(fd)

    def _walk(
        self,
        fd: int,
        rel: str,
        depth: int,
    ) -> Iterator[tuple[str, os.stat_result, IO[bytes] | None]]:
        if depth > MAX_TREE_DEPTH:
            raise TaskError(
                f"{self.rel} in {self.task_dir} nests deeper than {MAX_TREE_DEPTH} levels"
            )
        yield rel, os.fstat(fd), None
        for name in sorted(os.listdir(fd)):
            self.entries += 1
            if self.entries > MAX_TREE_ENTRIES:
                raise TaskError(
                    f"{self.rel} in {self.task_dir} holds more than {MAX_TREE_ENTRIES} entries"
                )
            child = f"{rel}/{name}" if rel else name
            shown = f"{self.rel}/{child}"
            mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
            if stat.S_ISDIR(mode):
                try:
                    sub = os.open(name, _DIR, dir_fd=fd)
                except OSError as exc:
                    raise _refused(self.task_dir, shown, _why_not(fd, name, exc)) from None
                try:
                    yield from self._walk(sub, child, depth + 1)
                finally:
                    os.close(sub)
                continue
            try:
                file_fd = os.open(name, _FILE, dir_fd=fd)
            except OSError as exc:
                raise _refused(self.task_dir, shown, _why_not(fd, name, exc)) from None
            with os.fdopen(file_fd, "rb") as handle:
                st = os.fstat(file_fd)
                if not stat.S_ISREG(st.st_mode):
                    raise _refused(self.task_dir, shown, _kind_of(st.st_mode))
                if st.st_nlink != 1:
                    raise _refused(self.task_dir, shown, _hard_link(st.st_nlink))
                self.bytes += st.st_size
                if self.bytes > MAX_FOLDER_BYTES:
                    raise TaskError(
                        f"{self.rel} in {self.task_dir} holds more than {MAX_FOLDER_BYTES} bytes"
                    )
                yield child, st, handle


def pack_task_folder(task_dir: Path, rel: str, arcname: str) -> bytes:
    """A tar of the task folder `rel` (tests/, solution/) under `arcname`, for a sandbox's own
    tar to unpack; TaskError for any entry read_task_file would refuse."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for path, st, handle in _Folder(task_dir, rel).walk():
            info = tarfile.TarInfo(f"{arcname}/{path}" if path else arcname)
            info.mode, info.mtime = stat.S_IMODE(st.st_mode) & 0o777, int(st.st_mtime)
            if handle is None:
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
            else:
                info.size = st.st_size
                archive.addfile(info, _Sized(handle, st.st_size))
    return buffer.getvalue()


def copy_task_folder(task_dir: Path, rel: str, target: Path) -> None:
    """Copy the task folder `rel` (environment/) into the host folder `target` (an image
    build's context), file by file as pack_task_folder reads them."""
    for path, st, handle in _Folder(task_dir, rel).walk():
        out = target / path if path else target
        if handle is None:
            out.mkdir(parents=True, exist_ok=True)
            continue
        with open(out, "wb") as copy:
            left = st.st_size
            while left > 0:
                chunk = handle.read(min(_CHUNK, left))
                if not chunk:
                    break
                copy.write(chunk)
                left -= len(chunk)
        os.chmod(out, stat.S_IMODE(st.st_mode) & 0o777)


class _Sized(io.RawIOBase):
    """Exactly `size` bytes of a file (zeros past a file that shrank while it was read), so a
    change under the reader cannot desynchronize the tar."""

    def __init__(self, source: IO[bytes], size: int) -> None:
        self._source, self._left = source, size

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = self._left if n is None or n < 0 else min(n, self._left)
        data = self._source.read(n) if n else b""
        data += b"\0" * (n - len(data))
        self._left -= len(data)
        return data
