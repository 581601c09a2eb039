"""The host's side of a local sandbox's files (its folder is a host folder): ownership, reads
through the host's read-only /usr bind, and deletes before a restore."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from skyrl_agent.sandboxes.artifacts import ArtifactLimitExceeded, remove_tree_path
from skyrl_agent.sandboxes.base import UnsupportedEnvironment

SYSTEM_TOPS = frozenset({"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "proc",
                         "dev", ".skyrl"})
"""Top-level folders that are binds or mounts inside the sandbox, not its own files."""


def chown_tree(path: Path, uid: int) -> None:
    os.chown(path, uid, uid)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, uid, follow_symlinks=False)


def host_system_file(remote: str) -> Path | None:
    """The host file behind a path on the sandbox's read-only /usr bind, else None."""
    parts = [p for p in remote.split("/") if p not in ("", ".")]
    if len(parts) < 2 or parts[0] != "usr" or ".." in parts:
        return None
    path = Path("/", *parts).resolve()
    return path if path.is_relative_to("/usr") else None


def read_host_file(path: Path, limit: int) -> bytes | None:
    if not path.is_file():
        return None
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise ArtifactLimitExceeded(f"{path} holds more than {limit} bytes")
    return data


def require_traversable(path: Path) -> None:
    for folder in [path, *path.parents]:
        if not folder.stat().st_mode & 0o001:
            raise UnsupportedEnvironment(
                f"sandbox.work_root {path}: {folder} is not searchable by other users, so the "
                f"unprivileged sandbox user cannot reach it (chmod o+x {folder}, or pick another)")


def clear_on_host(root: Path, remote_paths: Sequence[str]) -> list[str]:
    """Delete each sandbox path from the host side (no process started: this is on the
    verifier's hand-over); the paths returned could not be deleted so and are left to `rm`
    inside the sandbox (see remove_tree_path). System folders are always left to it."""
    return [path for path in remote_paths
            if path.strip("/").split("/")[0] in SYSTEM_TOPS or not remove_tree_path(root, path)]
