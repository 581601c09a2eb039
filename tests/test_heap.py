"""A training pass hands the CPU memory it freed back to the system: glibc otherwise keeps the
freed part of its heaps resident, and an RL run on long contexts grew until it was killed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from skyrl_agent.backends import torch_backend
from skyrl_agent.backends.backend import Datum
from skyrl_agent.backends.heap import release_freed_heap
from skyrl_agent.backends.torch_backend import TorchBackend

# In a fresh process: 3,200 touched 64 KB blocks from the heap (under glibc's mmap threshold),
# one small block above them so the heap's top cannot shrink, then the blocks freed.
FRAGMENTED_HEAP = """
import ctypes, ctypes.util
from skyrl_agent.backends.heap import release_freed_heap
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def resident_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 // 2**20
blocks = [libc.malloc(64 * 1024) for _ in range(3200)]
for block in blocks:
    ctypes.memset(block, 1, 64 * 1024)
pin = libc.malloc(4096)
for block in blocks:
    libc.free(block)
before = resident_mb()
released = release_freed_heap()
print(before, resident_mb(), released)
"""


def test_freed_heap_pages_go_back_to_the_system():
    """Stops: the trim skipped or a no-op (the 200 MB freed under a live block stay resident)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("glibc's heaps are Linux's")
    out = subprocess.run([sys.executable, "-c", FRAGMENTED_HEAP], capture_output=True,
                         text=True, check=True).stdout.split()
    before, after, released = int(out[0]), int(out[1]), out[2] == "True"
    assert released
    assert before - after >= 150, (before, after)


def test_every_pass_of_the_torch_backend_trims_the_heap(tiny_model_dir, monkeypatch):
    """Stops: a forward or forward_backward that leaves its freed logits and activations in the
    heap (the wiring; the trim itself is the test above)."""
    trims: list[bool] = []
    monkeypatch.setattr(torch_backend, "release_freed_heap",
                        lambda: trims.append(release_freed_heap()) or True)
    backend = TorchBackend(tiny_model_dir)
    datum = Datum((5, 6, 7), {"target_tokens": (6, 7, 8), "weights": (0.0, 1.0, 1.0),
                              "logprobs": (0.0, -1.0, -1.0), "advantages": (0.0, 1.0, 1.0)})
    backend.forward([datum])
    assert len(trims) == 1
    backend.forward_backward([datum], "importance_sampling")
    assert len(trims) == 2 and all(trims)
