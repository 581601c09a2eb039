"""The tar that carries host files into a sandbox (unpacked there by the sandbox's own tar).

Nothing comes out of a sandbox this way: see artifacts.py for the other direction."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path


def pack(local: Path, remote: str) -> bytes:
    """A tar holding `local` (file or folder) under the base name of `remote`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.add(local, arcname=os.path.basename(remote.rstrip("/")) or ".")
    return buffer.getvalue()


def one_file_tar(name: str, data: bytes, mode: int = 0o600) -> bytes:
    """A tar holding one regular file `name` with `data`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        member = tarfile.TarInfo(name)
        member.size, member.mode = len(data), mode
        archive.addfile(member, io.BytesIO(data))
    return buffer.getvalue()
