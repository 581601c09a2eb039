"""One rank of the FSDP2 backend: the torch backend's model, sharded over the process group.

Each decoder layer and then the whole model are wrapped by `fully_shard`, so a rank keeps
1/world_size of every parameter, gradient and optimizer moment, and gathers a layer's full
weights only while that layer runs. Ranks train on different rows of the batch; their gradients
are summed, not averaged (the loss already carries the whole batch's reduction weights), so the
sum over ranks is the one-process gradient.

Checkpoints and exports gather full tensors onto rank 0 and are written in the one-process
backend's form: a run saved here resumes on `TorchBackend` and the other way round. Weights for
the sampler are gathered one tensor at a time into the shared-memory file, so no rank ever holds
a full copy of the model beside its shard.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import distribute_tensor

from skyrl_agent.atomic import atomic_folder
from skyrl_agent.backends.backend import TrainingState
from skyrl_agent.backends.optimizer_state import by_name
from skyrl_agent.backends.passes import rng_state, set_rng_state
from skyrl_agent.backends.torch_backend import TorchBackend, full
from skyrl_agent.model.loading import (
    LoraSettings,
    export_model,
    load_causal_lm,
    lora_layers,
    server_parameters,
)
from skyrl_agent.model.weights.files import new_weights_path, remove_orphans
from skyrl_agent.model.weights.transport import WeightUpdate
from skyrl_agent.model.weights.writer import SharedWeights

_GATHERED = StateDictOptions(full_state_dict=True, cpu_offload=True)
"""Full tensors on rank 0 (in CPU memory), nothing on the other ranks."""
_SCATTERED = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
"""Full tensors read by rank 0 and sent to every rank's shard."""


class FsdpRank(TorchBackend):
    """The torch backend's primitives on one rank, over an FSDP2-sharded model."""

    sends_deltas = False

    def __init__(self, rank: int, world_size: int, device: str, model_folder: str,
                 lora: LoraSettings | None, dtype: str, micro_batch_tokens: int,
                 seed: int, routing_replay: bool = False) -> None:
        self.rank = rank
        self.mesh = init_device_mesh("cuda" if device.startswith("cuda") else "cpu",
                                     (world_size,))
        local = f"cuda:{torch.cuda.current_device()}" if device.startswith("cuda") else "cpu"
        super().__init__(Path(model_folder), lora=lora, device=local, dtype=dtype,
                         micro_batch_tokens=micro_batch_tokens, seed=seed,
                         routing_replay=routing_replay)

    def _place(self, model: Any) -> Any:
        """Shard each decoder layer, then the rest (embeddings, final norm, head)."""
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        if self.lora is not None and any(".experts." in name for name in lora_layers(model)):
            raise ValueError("LoRA on MoE expert weights needs backend=torch (the FSDP2 "
                             "backend does not gather per-expert adapters for the sampler)")
        layer_kinds = set(getattr(base, "_no_split_modules", None) or ())
        if not layer_kinds:
            raise ValueError(f"{type(base).__name__} names no decoder layer class "
                             f"(_no_split_modules): cannot shard it layer by layer")
        for module in list(model.modules()):
            if type(module).__name__ in layer_kinds:
                fully_shard(module, mesh=self.mesh)
        fully_shard(model, mesh=self.mesh)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                # Sum over ranks; a plain sum, since gloo has no pre-scaled reduction.
                module.set_gradient_divide_factor(1.0)
                module.set_force_sum_reduction_for_comms(True)
        return model

    # ---- checkpoints -------------------------------------------------------------------------

    def save_state(self, path: Path, data_position: int = 0) -> None:
        weights: dict[str, Any] = get_model_state_dict(self.model, options=_GATHERED)
        optimizer = get_optimizer_state_dict(self.model, self.optimizer, options=_GATHERED)
        rngs: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(rngs, rng_state())
        if self.rank == 0:
            with atomic_folder(Path(path), replace=True) as staging:
                save_file({name: weights[name].contiguous() for name in self.params},
                          staging / "weights.safetensors")
                torch.save({"optimizer": by_name(optimizer, list(self.params)), "rng": rngs},
                           staging / "optimizer.pt")
                (staging / "state.json").write_text(json.dumps(
                    {"step": self.step, "data_position": data_position}))
        dist.barrier()  # the call returns once the checkpoint is in place

    def load_state(self, path: Path, optimizer: bool = True) -> TrainingState:
        path = Path(path)
        problem = [self._unfit(path) if self.rank == 0 else None]
        dist.broadcast_object_list(problem, src=0)
        if problem[0]:
            raise ValueError(problem[0])  # on every rank alike: none waits in a collective
        weights = load_file(path / "weights.safetensors") if self.rank == 0 else {}
        with torch.no_grad():
            for name, param in self.params.items():
                # Rank 0's full tensor, scattered into every rank's shard (others pass a blank).
                sharded: Any = param  # a DTensor parameter
                source = weights[name] if self.rank == 0 else torch.empty(param.shape)
                param.copy_(distribute_tensor(source.to(param.dtype), sharded.device_mesh,
                                              sharded.placements))
        state = json.loads((path / "state.json").read_text())
        if not optimizer:
            self.optimizer.state.clear()
            self.optimizer.zero_grad(set_to_none=True)
            return TrainingState(step=self.step, data_position=int(state["data_position"]))
        saved = torch.load(path / "optimizer.pt", weights_only=False) if self.rank == 0 else {}
        set_optimizer_state_dict(self.model, self.optimizer,
                                 by_name(saved["optimizer"], list(self.params))
                                 if self.rank == 0 else {}, options=_SCATTERED)
        rngs: list[Any] = [saved["rng"] if self.rank == 0 else None]
        dist.broadcast_object_list(rngs, src=0)
        set_rng_state(rngs[0], self.rank)
        self.step = int(state["step"])
        return TrainingState(step=self.step, data_position=int(state["data_position"]))

    def _unfit(self, path: Path) -> str | None:
        """Why the checkpoint at `path` cannot load into this model, or None."""
        with safe_open(path / "weights.safetensors", framework="pt") as weights:
            missing = set(self.params) - set(weights.keys())
        if missing:
            return (f"{path} does not fit this model: {len(missing)} parameters missing, "
                    f"e.g. {sorted(missing)[0]}")
        return None

    # ---- weights out -------------------------------------------------------------------------

    def gather_for_sampler(self, version: int) -> WeightUpdate | None:
        """The driver's save_weights_for_sampler: rank 0 writes the shared-memory file and
        returns the update; the others only take part in the gathers."""
        started = time.perf_counter()
        if self._shared is None and self.rank == 0:
            remove_orphans()
            self._shared = SharedWeights(new_weights_path(), self._sampler_layout())
        for name, tensor in self._sampler_stream():
            if self._shared is not None:
                self._shared.views[name].copy_(tensor)
        if self._shared is None:
            return None
        return WeightUpdate(self._shared.path, version, self._shared.nbytes,
                            time.perf_counter() - started)

    def _sampler_layout(self) -> dict[str, torch.Tensor]:
        """Meta tensors of the sampler's names, full shapes and dtypes (no data)."""
        if self.lora is not None:
            sources = {name: layer.get_base_layer().weight
                       for name, layer in lora_layers(self.model).items()}
        else:
            sources = server_parameters(self.model)
        return {name: torch.empty(tuple(t.shape), dtype=t.dtype, device="meta")
                for name, t in sources.items()}

    def _sampler_stream(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The sampler's tensors, each gathered whole (every rank takes part) one at a time."""
        with torch.no_grad():
            if self.lora is None:
                for name, param in server_parameters(self.model).items():
                    yield name, full(param.detach())
                return
            for name, layer in lora_layers(self.model).items():
                base = full(layer.get_base_layer().weight.detach())
                down = full(layer.lora_A["default"].weight.detach())
                up = full(layer.lora_B["default"].weight.detach())
                yield name, base + (up @ down) * layer.scaling["default"]

    def export(self, target: Path) -> None:
        weights = get_model_state_dict(self.model, options=_GATHERED)
        if self.rank == 0:
            model = load_causal_lm(self.model_folder, self.dtype, torch.device("cpu"), self.lora)
            model.load_state_dict(weights)
            export_model(model, self.model_folder, Path(target))
        dist.barrier()

    def full_tensors(self, kind: str) -> dict[str, torch.Tensor | None] | None:
        """Rank 0: every trainable parameter (`params`) or its gradient (`grads`), whole."""
        out: dict[str, torch.Tensor | None] = {}
        for name, param in self.params.items():
            tensor = param.detach() if kind == "params" else param.grad
            out[name] = None if tensor is None else full(tensor).cpu()
        return out if self.rank == 0 else None
