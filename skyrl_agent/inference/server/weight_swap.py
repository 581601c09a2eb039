"""Weight updates the sampler barely sees: the next weights are written into a second set of
buffers while decoding goes on, and the swap at a decode-step boundary is one pointer change per
tensor.

The two sets differ only where the last updates wrote (`lag`). Before a delta update (only
changed tensors or rows) is staged, the back set catches up on that difference from the front,
so a delta always lands on the weights it was computed against. A full update needs no catch-up.
The back set is made at the first update: a server that is never updated keeps one copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from skyrl_agent.model.weights.reader import WeightLoader

Rows = Mapping[str, tuple[int, ...] | None]
"""Tensor name -> the rows written (None: all of it)."""


class DoubleBufferedWeights:
    """A model's weights plus a back set the next update is staged into."""

    def __init__(self, model: Any, loader: WeightLoader) -> None:
        self._tensors: dict[str, torch.Tensor] = {}
        self._canonical: dict[str, str] = {}
        """Every state-dict name -> the first name of its tensor (tied weights are one)."""
        seen: dict[int, str] = {}
        for name, tensor in model.state_dict(keep_vars=True).items():
            first = seen.setdefault(id(tensor), name)
            self._canonical[name] = first
            if first == name:
                self._tensors[name] = tensor
        self._loader = loader
        self._back: dict[str, torch.Tensor] | None = None
        self._lag: Rows | None = {}
        """Where the back set differs from the front: {} nowhere, None anywhere."""

    def stage(self, path: str | Path, rows: Rows | None) -> int:
        """Write the file's tensors (only `rows`, when given) into the back set; the front, which
        the engine keeps decoding with, is only read. Not on the engine thread; one at a time.
        Returns how many tensors were written."""
        back = self._back_set()
        if rows is not None:
            self._catch_up(back)
        targets = {name: back[first] for name, first in self._canonical.items()}
        written = self._loader.load(targets, path, rows)  # checks the file before any write
        self._lag = None if rows is None else {self._canonical[name]: rows[name] for name in rows}
        return written

    def swap(self) -> None:
        """Serve the staged weights: on the engine thread, between two decode steps."""
        assert self._back is not None, "stage() comes first"
        for name, tensor in self._tensors.items():
            front = tensor.data
            tensor.data = self._back[name]
            self._back[name] = front

    def _back_set(self) -> dict[str, torch.Tensor]:
        if self._back is None:
            with torch.no_grad():
                self._back = {name: t.detach().clone() for name, t in self._tensors.items()}
            self._lag = {}
        return self._back

    def _catch_up(self, back: dict[str, torch.Tensor]) -> None:
        lag = self._lag
        if lag == {}:
            return
        with torch.no_grad():
            for name, tensor in self._tensors.items():
                if lag is not None and name not in lag:
                    continue
                picked = None if lag is None else lag[name]
                if picked is None:
                    back[name].copy_(tensor.data)
                else:
                    index = torch.tensor(picked, dtype=torch.long, device=tensor.device)
                    back[name][index] = tensor.data[index]
        self._lag = {}
