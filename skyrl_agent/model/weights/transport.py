"""What a trainer hands the inference servers, and the one shape every transport delivers it in.

A backend's `save_weights_for_sampler` returns a `WeightUpdate`; a `WeightSender` delivers it to
every server and returns each server's seconds. Today's transport is the file: a safetensors file
in shared memory (writer.py) that each server loads by path — the embedded server through its
`/update_weights` route, vLLM through our transfer backend's update routes, paused around the
load. Transports that move tensors without a file (NCCL broadcast on GPUs, Ray's direct
transport) are further senders of the same `send(update)`, chosen where the servers are wired
to the trainer (`jobs/`, `distributed/`); the loops see only this protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from skyrl_agent.types import ChangedWeights


@dataclass(frozen=True)
class WeightUpdate:
    """Weights the inference servers can load: a safetensors file (POST /update_weights)."""

    path: Path
    """The file; on one machine it lives in shared memory and is rewritten in place."""
    version: int
    """The policy version these weights are."""
    nbytes: int
    """Bytes of tensor data the server will copy."""
    seconds: float
    """Trainer-side time to produce the file."""
    changed: ChangedWeights | None = None
    """What changed since the previous update, for servers that hold it; None: load all."""
    adapter: Path | None = None
    """LoRA: the same weights as a PEFT adapter folder (adapter_config.json and
    adapter_model.safetensors), what a server with runtime LoRA (vLLM) loads instead of the
    merged file: the adapters' bytes, not the adapted layers'."""


class WeightSender(Protocol):
    """Delivers updates to every inference server."""

    async def send(self, update: WeightUpdate) -> list[float]:
        """Every server serves `update`'s weights from one of its decode steps on (servers that
        cannot load beside decoding are paused around it; those with runtime LoRA load the
        adapter when it has one); each server's seconds."""
        ...
