"""Which files `/update_weights` may read: only weights the run wrote, never any host path.

A caller that can reach the control routes could otherwise make the server map any file it can
read (and learn from the error whether a path exists). So a path must lie inside one of the
server's weights folders, and it is opened one component at a time from that folder with
O_NOFOLLOW: a symlink anywhere on the way (planted to point out of the folder) is refused, and
there is no window between checking a path and opening it. Every refusal reads the same, whether
or not the file exists.

- The trainer's shared-memory folder (/dev/shm) is shared by every user of the machine, so in it
  only names the trainer gives its files (`skyrl-agent-weights-PID-N.safetensors`) that this
  user owns are accepted.
- Folders given with `--weights-dir` (a Tinker server's data dir, its base model's folder) accept
  any `.safetensors` file below them.
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from skyrl_agent.model.weights.files import TRAINER_FILE, shared_memory_dir

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO planted under the name must not hang the engine thread.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class WeightUpdateError(ValueError):
    """The file is refused, unreadable, or does not fit the served model."""


@dataclass(frozen=True)
class WeightsFolders:
    """The folders a server loads weights from (each resolved once, at start)."""

    shared: Path = field(default_factory=lambda: shared_memory_dir().resolve())
    """The trainer's shared-memory folder: its own weight files only."""
    folders: tuple[Path, ...] = ()
    """Any .safetensors file below these."""

    @classmethod
    def with_extra(cls, folders: tuple[str, ...]) -> WeightsFolders:
        return cls(folders=tuple(Path(f).resolve() for f in folders))

    def open(self, path: str | Path) -> int:
        """A read-only descriptor of `path`, or WeightUpdateError when it is not allowed."""
        candidate = PurePosixPath(path)
        if candidate.is_absolute() and ".." not in candidate.parts:
            for root, rest in self._placements(candidate):
                with contextlib.suppress(OSError):
                    return self._open_below(root, rest)
        raise WeightUpdateError(
            f"refusing to load weights from {str(path)!r}: it is not a regular .safetensors "
            f"file this server's run wrote into its weights folders")

    def _placements(self, path: PurePosixPath) -> list[tuple[Path, tuple[str, ...]]]:
        """(root, components below it) for each folder `path` lies in under its rules."""
        found = []
        for root in (self.shared, *self.folders):
            if not path.is_relative_to(root):
                continue
            rest = path.relative_to(root).parts
            if not rest or not rest[-1].endswith(".safetensors"):
                continue
            if root == self.shared and not (len(rest) == 1 and TRAINER_FILE.fullmatch(rest[0])):
                continue
            found.append((root, rest))
        return found

    def _open_below(self, root: Path, rest: tuple[str, ...]) -> int:
        fd = os.open(root, _DIR_FLAGS)
        try:
            for part in rest[:-1]:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = child
            file_fd = os.open(rest[-1], _FILE_FLAGS, dir_fd=fd)
        finally:
            os.close(fd)
        info = os.fstat(file_fd)
        mine = root != self.shared or info.st_uid == os.geteuid()
        if not (stat.S_ISREG(info.st_mode) and mine):
            os.close(file_fd)
            raise OSError("not a regular file of this user")
        return file_fd
