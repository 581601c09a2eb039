"""Tar helpers shared by backends that move files in and out as archives."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
from pathlib import Path


def pack(local: Path, remote: str) -> bytes:
    """A tar holding `local` (file or folder) under the base name of `remote`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.add(local, arcname=os.path.basename(remote.rstrip("/")) or ".")
    return buffer.getvalue()


def unpack(data: bytes, name: str, local: Path) -> None:
    """Write the tar entry `name` (file or folder) to `local`; unsafe members are refused."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        member = tar.getmember(name)
        if member.isfile():
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_bytes(tar.extractfile(member).read())
            return
        with tempfile.TemporaryDirectory() as scratch:
            tar.extractall(scratch, filter="data")
            shutil.copytree(Path(scratch) / name, local, dirs_exist_ok=True)
