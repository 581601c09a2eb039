"""A safetensors file in shared memory that the trainer writes through a read-write mapping.

The file is laid out once, for a fixed set of names, dtypes and shapes, and mapped into the
trainer. `SharedWeights.views` are tensors that alias the file's data, so publishing new weights
is one in-place copy (`write`), or none at all once the trainer's CPU parameters live in the
mapping (`adopt`). The inference server reads the same file with
`skyrl_agent.model.weights.reader.load_weights`, which costs it one copy.

Nothing here locks: the file is consistent only while the trainer leaves it alone, so the caller
sequences each round as export (write) -> server load -> next optimizer step. A step taken while
the server copies would hand the server a mix of old and new weights.
"""

from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import torch

_DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
}
# Where each tensor's data may start: a cache line, and more than any element needs. Only the
# start of the data region can be chosen freely (by padding the header); see _data_order.
_ALIGNMENT = 64
_LENGTH_PREFIX = 8  # the header's length: a little-endian u64


@dataclass(frozen=True)
class _Slot:
    """Where one tensor lives in the file; `begin`/`end` are relative to the data region."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int
    end: int


def _data_order(tensors: Mapping[str, torch.Tensor]) -> list[str]:
    """Names in the order their data is laid out.

    safetensors forbids gaps between tensors, so only the data region's start can be aligned.
    Tensors whose size is a multiple of the alignment go first (each of them then starts
    aligned); the rest follow by element size, largest first, so every tensor still starts at a
    multiple of its own element size (sizes are powers of two). The sort is stable, so names
    otherwise keep the caller's order.
    """

    def key(name: str) -> tuple[bool, int]:
        tensor = tensors[name]
        return (tensor.nbytes % _ALIGNMENT != 0, -tensor.element_size())

    return sorted(tensors, key=key)


def _layout(tensors: Mapping[str, torch.Tensor]) -> tuple[bytes, dict[str, _Slot], int]:
    """The header (length prefix included, padded so the data starts aligned), each tensor's
    slot, and the data region's size."""
    slots: dict[str, _Slot] = {}
    offset = 0
    for name in _data_order(tensors):
        tensor = tensors[name]
        slots[name] = _Slot(tensor.dtype, tuple(tensor.shape), offset, offset + tensor.nbytes)
        offset += tensor.nbytes
    header = {
        name: {"dtype": _DTYPE_NAMES[slot.dtype], "shape": list(slot.shape),
               "data_offsets": [slot.begin, slot.end]}
        for name, slot in slots.items()
    }
    text = json.dumps(header, separators=(",", ":")).encode()
    # The format allows trailing spaces in the header; they are the only padding it allows.
    padding = -(_LENGTH_PREFIX + len(text)) % _ALIGNMENT
    text += b" " * padding
    return struct.pack("<Q", len(text)) + text, slots, offset


def _check_sources(tensors: Mapping[str, torch.Tensor]) -> None:
    for name, tensor in tensors.items():
        if tensor.dtype not in _DTYPE_NAMES:
            raise ValueError(f"{name}: dtype {tensor.dtype} is not supported "
                             f"(only {', '.join(str(d) for d in _DTYPE_NAMES)})")


def _create_exclusive(path: Path) -> int:
    """A new file only this user can read. O_EXCL (with O_NOFOLLOW for clarity) refuses any
    existing entry, a planted symlink included, so nobody can steer the weights elsewhere or
    read them from a file they prepared."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags, 0o600)
    except FileExistsError:
        raise FileExistsError(errno.EEXIST, "refusing to reuse an existing path for shared "
                              "weights (remove it or choose another)", str(path)) from None


def _reserve(fd: int, size: int) -> None:
    """Give the file its full size now. fallocate reserves the memory, so a full /dev/shm fails
    here rather than as a SIGBUS on some later write through the mapping."""
    fallocate = getattr(os, "posix_fallocate", None)  # macOS has none
    if fallocate is not None:
        try:
            fallocate(fd, 0, size)
            return
        except OSError as error:
            # Some file systems cannot preallocate; a plain size change still works there.
            if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
    os.ftruncate(fd, size)


class SharedWeights:
    """A safetensors file of fixed names, dtypes and shapes, mapped read-write.

    `views[name]` aliases the file's bytes for `name`: writing into it changes what the server
    loads next. A meta tensor among `tensors` reserves its slot without data (a sharded trainer
    fills it tensor by tensor). Call `close()` (or use `with`) when done: it unmaps and removes
    the file. Parameters that were adopted get private copies first, so the trainer keeps
    working after close.
    """

    def __init__(self, path: Path, tensors: Mapping[str, torch.Tensor]) -> None:
        _check_sources(tensors)
        self.path = Path(path)
        header, self._slots, data_size = _layout(tensors)
        self._data_start = len(header)
        self._adopted: dict[str, torch.nn.Parameter] = {}
        self._closed = False
        self.views: dict[str, torch.Tensor] = {}
        fd = _create_exclusive(self.path)
        try:
            size = len(header) + data_size
            _reserve(fd, size)
            # mmap keeps its own handle on the file, so ours can go right away.
            self._mapping = mmap.mmap(fd, size, flags=mmap.MAP_SHARED,
                                      prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.unlink(self.path)
            raise
        finally:
            os.close(fd)
        try:
            self._mapping[: len(header)] = header
            self.views = {name: self._view(slot) for name, slot in self._slots.items()}
            self.write({name: t for name, t in tensors.items() if not t.is_meta})
        except BaseException:
            self.close()
            raise

    def _view(self, slot: _Slot) -> torch.Tensor:
        if slot.begin == slot.end:
            # torch cannot view zero bytes of a buffer, and there is nothing to share.
            return torch.empty(slot.shape, dtype=slot.dtype)
        start = self._data_start + slot.begin
        # A memoryview slice, not the mmap itself: torch keeps the slice alive, and a live slice
        # makes mmap.close() refuse, so a view can never outlive the mapping it points into.
        window = memoryview(self._mapping)[start : self._data_start + slot.end]
        return torch.frombuffer(window, dtype=slot.dtype).view(slot.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data in the file (the header not counted)."""
        return sum(slot.end - slot.begin for slot in self._slots.values())

    def _check_fits(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Every name known and every shape right, checked before anything is written."""
        if self._closed:
            raise ValueError(f"{self.path} is closed")
        for name, tensor in tensors.items():
            slot = self._slots.get(name)
            if slot is None:
                raise ValueError(f"{name!r} is not in the shared weights file")
            if tuple(tensor.shape) != slot.shape:
                raise ValueError(f"{name}: shape {tuple(tensor.shape)} does not match the "
                                 f"file's {slot.shape}")

    def _is_view(self, name: str, tensor: torch.Tensor) -> bool:
        view = self.views[name]
        return (tensor.device.type == "cpu" and tensor.data_ptr() == view.data_ptr()
                and tensor.dtype == view.dtype and tensor.stride() == view.stride())

    def write(self, tensors: Mapping[str, torch.Tensor]) -> int:
        """Copy `tensors` (any device, any floating dtype: converted on copy) into the file;
        returns the bytes copied. Tensors that already live in the file are skipped."""
        self._check_fits(tensors)
        copied = 0
        with torch.no_grad():
            for name, tensor in tensors.items():
                if self._is_view(name, tensor):
                    continue
                view = self.views[name]
                view.copy_(tensor)
                copied += view.nbytes
        return copied

    def adopt(self, params: Mapping[str, torch.nn.Parameter]) -> None:
        """Move CPU parameters into the file: their values are copied in once and their `.data`
        becomes the view, so optimizer steps update the file directly and `write` of them copies
        nothing. Nothing changes unless every parameter qualifies."""
        self._check_fits(params)
        for name, param in params.items():
            view = self.views[name]
            if param.device.type != "cpu":
                raise ValueError(f"{name}: only CPU parameters can live in shared memory, "
                                 f"this one is on {param.device}")
            if param.dtype != view.dtype:
                raise ValueError(f"{name}: dtype {param.dtype} does not match the file's "
                                 f"{view.dtype}")
        self.write(params)
        for name, param in params.items():
            param.data = self.views[name]
            self._adopted[name] = param

    def _release_adopted(self) -> None:
        """Give adopted parameters private memory again. Views they kept would stay valid (see
        _view) but would pin the whole mapping in memory for as long as the trainer lives."""
        for name, param in self._adopted.items():
            if self._is_view(name, param):
                param.data = param.data.clone()
        self._adopted.clear()

    def close(self) -> None:
        """Unmap and remove the file. Safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        self._release_adopted()
        self.views = {}
        # If someone still holds a view, close() refuses and the mapping is unmapped when the
        # last view is gone, never before (see _view). The name can go now either way.
        with contextlib.suppress(BufferError):
            self._mapping.close()
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> SharedWeights:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()
