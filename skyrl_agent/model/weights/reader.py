"""Weight updates from a safetensors file the trainer wrote (ideally on /dev/shm).

The file is memory-mapped and each tensor is copied straight from the mapping into its
parameter: no intermediate tensors, so an update costs about one memory copy of the weights.
The header is checked in full before the first parameter changes, so a bad file leaves the model
as it was: every name must exist in the model and every shape must match. A file may hold a
subset of the parameters; dtypes are converted on copy (a bf16 trainer can feed an fp32 server).
"""

from __future__ import annotations

import json
import mmap
import os
import stat
import struct
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from skyrl_agent.model.weights.folders import WeightsFolders, WeightUpdateError

_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
           "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
           "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


def _read_header(mapped: mmap.mmap, name: str) -> tuple[int, dict[str, Any]]:
    """The safetensors header: 8-byte little-endian length, then JSON {name: {dtype, shape,
    data_offsets}} with offsets relative to the end of the header."""
    try:
        (length,) = struct.unpack("<Q", mapped[:8])
        header = json.loads(mapped[8 : 8 + length])
    except (struct.error, ValueError, UnicodeDecodeError):
        raise WeightUpdateError(f"cannot read {name} as safetensors: bad header") from None
    if not isinstance(header, dict):
        raise WeightUpdateError(f"cannot read {name} as safetensors: bad header")
    header.pop("__metadata__", None)
    return 8 + length, header


def _check(header: dict[str, Any], params: Mapping[str, torch.Tensor], name: str,
           data_start: int, size: int) -> None:
    unknown = sorted(set(header) - set(params))
    if unknown:
        raise WeightUpdateError(f"{name}: {len(unknown)} names not in the model, "
                                f"e.g. {unknown[0]!r}")
    for key, info in header.items():
        shape = tuple(info.get("shape", ()))
        if info.get("dtype") not in _DTYPES:
            raise WeightUpdateError(f"{name}: {key} has unsupported dtype {info.get('dtype')!r}")
        if shape != tuple(params[key].shape):
            raise WeightUpdateError(f"{name}: {key} has shape {shape}, "
                                    f"the model's is {tuple(params[key].shape)}")
        begin, end = info["data_offsets"]
        expected = _DTYPES[info["dtype"]].itemsize * params[key].numel()
        if end - begin != expected or data_start + end > size:
            raise WeightUpdateError(f"{name}: {key} has a truncated or inconsistent data range")


class WeightLoader:
    """Loads weight files into one model, keeping the last file's mapping between updates.

    A trainer on the same machine rewrites one shared-memory file in place for every update.
    Mapping it afresh each time costs a page fault per 4 KiB page, as much again as the copy
    itself; a mapping kept from the previous update has its pages in place already. The mapping
    is shared, so it always shows the file's current bytes. A different file (path, inode or
    size) is mapped anew.
    """

    def __init__(self, folders: WeightsFolders | None = None) -> None:
        self.folders = folders
        """Where files may come from (None: anywhere; for callers in this process only)."""
        self._key: tuple[str, int, int, int] | None = None
        self._mapped: mmap.mmap | None = None

    def load(self, params: Mapping[str, torch.Tensor], path: str | Path,
             rows: Mapping[str, tuple[int, ...] | None] | None = None) -> int:
        """Copy the tensors in `path` into `params` (a model's state dict, or buffers shaped
        like it) in place; with `rows`, only the tensors it names (only their listed rows where
        it lists any). Returns how many were copied."""
        path = Path(path)
        fd = self.folders.open(path) if self.folders else _open_plain(path)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise WeightUpdateError(f"weights file not found: {path}")
            key = (str(path), info.st_dev, info.st_ino, info.st_size)
            if key != self._key or self._mapped is None:
                self.close()
                self._mapped = _map(fd, path.name)
                self._key = key
        finally:
            os.close(fd)
        return _copy_into(params, self._mapped, path.name, rows)

    def close(self) -> None:
        if self._mapped is not None:
            self._mapped.close()
        self._mapped, self._key = None, None


def _runs(rows: tuple[int, ...]) -> list[tuple[int, int]]:
    """Sorted rows as [first, end) ranges of consecutive ones."""
    runs: list[tuple[int, int]] = []
    for row in sorted(set(rows)):
        if runs and runs[-1][1] == row:
            runs[-1] = (runs[-1][0], row + 1)
        else:
            runs.append((row, row + 1))
    return runs


def _check_rows(rows: Mapping[str, tuple[int, ...] | None], header: dict[str, Any],
                params: Mapping[str, torch.Tensor], name: str) -> None:
    for key, picked in rows.items():
        if key not in header:
            raise WeightUpdateError(f"{name}: changed tensor {key} is not in the file")
        if picked is not None and any(not 0 <= r < params[key].shape[0] for r in picked):
            raise WeightUpdateError(f"{name}: a changed row of {key} is outside its "
                                    f"{params[key].shape[0]} rows")


def load_weights(model: Any, path: str | Path) -> int:
    """Copy the tensors in `path` into `model` in place, once; returns how many were copied."""
    loader = WeightLoader()
    try:
        return loader.load(model.state_dict(keep_vars=True), path)
    finally:
        loader.close()


def _open_plain(path: Path) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        raise WeightUpdateError(f"weights file not found: {path}") from None


def _map(fd: int, name: str) -> mmap.mmap:
    try:
        return mmap.mmap(fd, 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    except ValueError:
        raise WeightUpdateError(f"cannot read {name} as safetensors: empty file") from None


def _copy_into(params: Mapping[str, torch.Tensor], mapped: mmap.mmap, name: str,
               rows: Mapping[str, tuple[int, ...] | None] | None = None) -> int:
    data_start, header = _read_header(mapped, name)
    _check(header, params, name, data_start, len(mapped))
    if rows is not None:
        _check_rows(rows, header, params, name)
        header = {key: info for key, info in header.items() if key in rows}
    buffer = memoryview(mapped)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            # The mapping is read-only and torch says so; nothing ever writes through it.
            warnings.filterwarnings("ignore", message="The given buffer is not writable")
            for key, info in header.items():
                begin, end = info["data_offsets"]
                if begin == end:
                    continue
                source = torch.frombuffer(buffer[data_start + begin : data_start + end],
                                          dtype=_DTYPES[info["dtype"]])
                target, picked = params[key], None if rows is None else rows[key]
                if picked is None:
                    target.copy_(source.view(target.shape))
                else:  # runs of consecutive rows: plain copies, not a gather and scatter
                    shaped = source.view(target.shape)
                    for first, end in _runs(picked):
                        target[first:end].copy_(shaped[first:end])
                del source  # a live view would keep the mapping from closing
    finally:
        buffer.release()
    return len(header)
