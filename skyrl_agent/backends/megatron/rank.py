"""One rank of the Megatron backend: the torch backend's primitives over a GPTModel shard.

The ranks form tensor-parallel groups of `tp` consecutive ranks (one model copy each) and
data-parallel groups across them (megatron-core's `parallel_state`). A rank loads the Hugging
Face model, keeps its tensor-parallel shard as a GPTModel, and trains it with plain AdamW over
the shards: megatron-core's own optimizer and DDP wrapper need CUDA. What Megatron does not do
for us here, done by hand: logprobs and entropy over the vocabulary split across ranks, the
global gradient norm (sharded parameters summed over the TP group, replicated ones counted once),
and the sum of gradients over data-parallel copies.

Everything that leaves a rank — checkpoints, exports, weights for the sampler, Adam's moments —
is gathered and mapped back to the Hugging Face names (`mapping`), so a Megatron checkpoint is
the one-process backend's checkpoint, and either resumes the other.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state, tensor_parallel
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from skyrl_agent.atomic import atomic_folder
from skyrl_agent.backends.backend import Datum, TrainingState
from skyrl_agent.backends.megatron.mapping import (
    Layout,
    Piece,
    pieces,
    shard,
    unshard,
    unsupported,
)
from skyrl_agent.backends.megatron.model import build_gpt
from skyrl_agent.backends.passes import rng_state, set_rng_state, stack, stack_routing
from skyrl_agent.backends.torch_backend import TorchBackend
from skyrl_agent.model.loading import LoraSettings, export_model, load_causal_lm
from skyrl_agent.model.weights.files import new_weights_path, remove_orphans
from skyrl_agent.model.weights.transport import WeightUpdate


def _is_expert(name: str) -> bool:
    return ".mlp.experts." in name


_NEG = -1e30
"""Logit of a padding row of the vocabulary: finite (entropy multiplies it by 0), never drawn."""


class MegatronRank(TorchBackend):
    """Tinker's primitives on one tensor-parallel shard of a GPTModel."""

    sends_deltas = False

    def __init__(self, rank: int, world_size: int, device: str, model_folder: str,
                 tp: int, lora: LoraSettings | None, dtype: str,
                 micro_batch_tokens: int, seed: int, ep: int = 1,
                 routing_replay: bool = False) -> None:
        if lora is not None:
            raise ValueError("LoRA is not available with trainer.backend=megatron yet; use "
                             "trainer.backend=fsdp or torch for LoRA")
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp,
                                                 expert_model_parallel_size=ep)
        # Dropout is 0: the no-op tracker is exact (the training tracker seeds CUDA).
        from megatron.core.tensor_parallel.random import initialize_rng_tracker

        initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
        self.rank = rank
        self.tp = tp
        self.tp_rank = parallel_state.get_tensor_model_parallel_rank()
        self.tp_group = parallel_state.get_tensor_model_parallel_group()
        self.dp_group = parallel_state.get_data_parallel_group()
        self.ep = ep
        self.ep_rank = parallel_state.get_expert_model_parallel_rank()
        self.ep_group = parallel_state.get_expert_model_parallel_group()
        self.expert_dp_group = parallel_state.get_expert_data_parallel_group()
        self.replays_routing = routing_replay
        if self.tp_rank != rank % tp:
            raise RuntimeError("unexpected rank order: the driver assumes consecutive TP ranks")
        self.on_cpu = not device.startswith("cuda")
        local = "cpu" if self.on_cpu else f"cuda:{torch.cuda.current_device()}"
        super().__init__(Path(model_folder), lora=None, device=local, dtype=dtype,
                         micro_batch_tokens=micro_batch_tokens, seed=seed)

    def _place(self, model: Any) -> Any:
        """The Hugging Face model -> this rank's GPTModel shard (the HF copy is dropped)."""
        problem = unsupported(model.config, self.tp, self.ep)
        if problem:
            raise ValueError(problem)
        self.layout = Layout.of(model.config, self.tp, self.ep)
        self.pieces: list[Piece] = pieces(self.layout, self.ep_rank)
        full = dict(model.state_dict())
        self.server_shapes = {name: (tuple(p.shape), p.dtype)
                              for name, p in model.named_parameters()}
        gpt = build_gpt(model.config, self.layout, self.dtype, self.on_cpu)
        gpt.load_state_dict({p.megatron: shard(p, full, self.layout, self.tp_rank)
                             for p in self.pieces}, strict=True)
        gpt.to(self.device)
        gpt.eval()
        return gpt

    # ---- the forward pass over a split vocabulary ------------------------------------------

    def _logprobs(self, model: Any, data: Sequence[Datum]) -> tuple[torch.Tensor, torch.Tensor]:
        rows, width = self._batch_shape(data)
        input_ids = torch.zeros(rows, width, dtype=torch.long)
        for row, datum in enumerate(data):
            input_ids[row, : len(datum.model_input)] = torch.tensor(datum.model_input)
        positions = torch.arange(width).expand(rows, width)
        causal = torch.ones(1, 1, width, width, dtype=torch.bool)  # unread: see SdpaAttention
        with self._router_inputs(model, data, rows, width):
            logits_BTV = model(input_ids.to(self.device), positions.to(self.device),
                               causal.to(self.device)).float()
        width = max(len(d.model_input) for d in data)
        logits_BTV = logits_BTV[: len(data), :width]  # without the padding _batch_shape added
        first = self.tp_rank * logits_BTV.shape[-1]
        padding = torch.arange(first, first + logits_BTV.shape[-1], device=self.device) \
            >= self.layout.vocab
        logits_BTV = logits_BTV.masked_fill(padding, _NEG)
        targets_BT = stack(data, "target_tokens", self.device)
        # A copy, always: Megatron's cross entropy overwrites its input with probabilities, and
        # a transpose of a one-row batch is already contiguous (no copy of its own).
        logits_TBV = logits_BTV.transpose(0, 1).clone(memory_format=torch.contiguous_format)
        loss_TB = tensor_parallel.vocab_parallel_cross_entropy(
            logits_TBV, targets_BT.transpose(0, 1).contiguous(), tp_group=self.tp_group)
        return -loss_TB.transpose(0, 1), logits_BTV

    def _batch_shape(self, data: Sequence[Datum]) -> tuple[int, int]:
        """Rows and width of the forward's input. On CPU the expert-parallel all-to-all runs in
        drop-and-pad mode (see `moe`), whose buffers are sized by the tokens of each rank: every
        rank of the expert-parallel group pads its micro-batch to the group's largest shape."""
        shape = (len(data), max(len(d.model_input) for d in data))
        if not (self.layout.experts and self.ep > 1 and self.on_cpu):
            return shape
        largest = torch.tensor(shape)
        dist.all_reduce(largest, op=dist.ReduceOp.MAX, group=self.ep_group)
        return int(largest[0]), int(largest[1])

    @contextlib.contextmanager
    def _router_inputs(self, model: Any, data: Sequence[Datum], rows: int,
                       width: int) -> Iterator[None]:
        """The sampler's routing given to each MoE router of `model` for this forward (R3), or
        only compared with the router's own choice when replay is off."""
        experts_BTLK = stack_routing(data, rows, width) if self.layout.experts else None
        if experts_BTLK is None:
            yield
            return
        from skyrl_agent.backends.megatron.moe import attach_replay

        hooks = getattr(model, "replay_hooks", None)
        if hooks is None:
            hooks = model.replay_hooks = attach_replay(model, self.routing, self.replays_routing)
        # Megatron's tokens run sequence-major: row t * batch + b.
        experts_NLK = experts_BTLK.transpose(0, 1).flatten(0, 1)
        for layer, hook in enumerate(hooks):
            hook.recorded_NK = experts_NLK[:, layer]
        try:
            yield
        finally:
            for hook in hooks:
                hook.recorded_NK = None

    def _entropy(self, logits_BTV: torch.Tensor) -> torch.Tensor:
        """H = logsumexp(z) - sum_v p_v z_v, each sum over the vocabulary split across ranks."""
        top_BT = logits_BTV.max(dim=-1).values
        dist.all_reduce(top_BT, op=dist.ReduceOp.MAX, group=self.tp_group)
        scaled_BTV = (logits_BTV - top_BT[..., None]).exp()
        sums = torch.stack([scaled_BTV.sum(-1), (scaled_BTV * logits_BTV).sum(-1)])
        dist.all_reduce(sums, group=self.tp_group)
        return sums[0].log() + top_BT - sums[1] / sums[0]

    def _clip_gradients(self, limit: float) -> float:
        """Sum gradients over data-parallel copies, then clip by the global norm. An expert's
        gradient already holds every expert-parallel rank's tokens (they reached it through the
        all-to-all): it is summed only over the copies of that expert."""
        grads = [p.grad for p in self.params.values() if p.grad is not None]
        for name, param in self.params.items():
            group = self.expert_dp_group if _is_expert(name) else self.dp_group
            if param.grad is not None and dist.get_world_size(group) > 1:
                dist.all_reduce(param.grad, group=group)
        sharded = torch.zeros((), dtype=torch.float64, device=self.device)
        experts = torch.zeros((), dtype=torch.float64, device=self.device)
        replicated = torch.zeros((), dtype=torch.float64, device=self.device)
        for name, param in self.params.items():
            if param.grad is None:
                continue
            square = param.grad.double().pow(2).sum()
            if _is_expert(name):
                experts += square  # each expert-parallel rank holds other experts
            elif getattr(param, "tensor_model_parallel", False):
                sharded += square
            else:
                replicated += square  # the same on every TP rank: counted once
        dist.all_reduce(sharded, group=self.tp_group)
        dist.all_reduce(experts, group=self.ep_group)
        norm = math.sqrt(float(sharded + experts + replicated))
        scale = min(1.0, limit / (norm + 1e-6))
        if scale < 1.0:
            for grad in grads:
                grad.mul_(scale)
        return norm

    # ---- whole tensors out, by Hugging Face names -------------------------------------------

    def _gathered(self, local: dict[str, torch.Tensor | None]) -> Iterator[
            tuple[Piece, dict[str, torch.Tensor]]]:
        """Each piece's full HF tensors from `local` shards (by Megatron name), one piece at a
        time (an MoE layer's experts of one weight together); every rank takes part, the TP
        group's ranks all receive them."""
        done: set[str] = set()
        for piece in self.pieces:
            if piece.kind == "expert":
                if piece.hf[0] not in done:
                    done.add(piece.hf[0])
                    yield from self._gathered_experts(piece, local)
                continue
            tensor = local.get(piece.megatron)
            if tensor is None:
                continue
            if piece.kind == "replicated":
                yield piece, unshard(piece, [tensor.detach().cpu()], self.layout)
                continue
            shards = [torch.empty_like(tensor) for _ in range(self.tp)]
            dist.all_gather(shards, tensor.detach().contiguous(), group=self.tp_group)
            yield piece, unshard(piece, [s.cpu() for s in shards], self.layout)

    def _gathered_experts(self, first: Piece, local: dict[str, torch.Tensor | None],
                          ) -> Iterator[tuple[Piece, dict[str, torch.Tensor]]]:
        """The stacked [experts, ...] HF tensor of `first`'s weight, from every expert-parallel
        rank's local experts (a missing local tensor, e.g. no moment yet, counts as zeros)."""
        group = [p for p in self.pieces if p.hf == first.hf]
        slices = []
        for piece in group:
            tensor = local.get(piece.megatron)
            slices.append(torch.zeros_like(self.params[piece.megatron]) if tensor is None
                          else tensor.detach())
        mine = torch.stack(slices)
        stacks = [torch.empty_like(mine) for _ in range(self.ep)]
        dist.all_gather(stacks, mine.contiguous(), group=self.ep_group)
        yield first, {first.hf[0]: torch.cat([s.cpu() for s in stacks])}

    def full_tensors(self, kind: str) -> dict[str, torch.Tensor] | None:
        """Rank 0: every parameter (`params`) or gradient (`grads`), whole, by HF names."""
        local = {name: p if kind == "params" else p.grad for name, p in self.params.items()}
        out: dict[str, torch.Tensor] = {}
        for _, tensors in self._gathered(local):
            out.update(tensors)
        return out if self.rank == 0 else None

    def gather_for_sampler(self, version: int) -> WeightUpdate | None:
        """Each tensor gathered and written into rank 0's shared-memory file in turn."""
        from skyrl_agent.model.weights.writer import SharedWeights

        started = time.perf_counter()
        if self._shared is None and self.rank == 0:
            remove_orphans()
            self._shared = SharedWeights(new_weights_path(), {
                name: torch.empty(shape, dtype=dtype, device="meta")
                for name, (shape, dtype) in self.server_shapes.items()})
        for _, tensors in self._gathered(dict(self.params)):
            if self._shared is not None:
                for name, tensor in tensors.items():
                    self._shared.views[name].copy_(tensor)
        if self._shared is None:
            return None
        return WeightUpdate(self._shared.path, version, self._shared.nbytes,
                            time.perf_counter() - started)

    def export(self, target: Path) -> None:
        weights = self.full_tensors("params")
        if weights is not None:
            model = load_causal_lm(self.model_folder, self.dtype, torch.device("cpu"), None)
            model.load_state_dict(weights, strict=False)  # a tied head is the embedding
            export_model(model, self.model_folder, Path(target))
        dist.barrier()

    # ---- checkpoints in the one-process form -----------------------------------------------

    def save_state(self, path: Path, data_position: int = 0) -> None:
        weights = self.full_tensors("params")
        moments: dict[str, dict[str, Any]] = {}
        for key in ("exp_avg", "exp_avg_sq"):
            local = {name: self.optimizer.state.get(p, {}).get(key)
                     for name, p in self.params.items()}
            for piece, tensors in self._gathered(local):
                step = self.optimizer.state[self.params[piece.megatron]]["step"]
                for name, tensor in tensors.items():
                    moments.setdefault(name, {"step": step})[key] = tensor
        rngs: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(rngs, rng_state())
        if weights is not None:
            group = {k: v for k, v in self.optimizer.state_dict()["param_groups"][0].items()
                     if k != "params"}
            optimizer = {"state": moments, "param_groups": [{**group, "params": list(weights)}]}
            with atomic_folder(Path(path), replace=True) as staging:
                save_file({n: t.contiguous() for n, t in weights.items()},
                          staging / "weights.safetensors")
                torch.save({"optimizer": optimizer, "rng": rngs}, staging / "optimizer.pt")
                (staging / "state.json").write_text(json.dumps(
                    {"step": self.step, "data_position": data_position}))
        dist.barrier()

    def load_state(self, path: Path, optimizer: bool = True) -> TrainingState:
        """Every rank reads the checkpoint and cuts its own shards (one machine, one disk)."""
        path = Path(path)
        needed = {name for piece in self.pieces for name in piece.hf}
        with safe_open(path / "weights.safetensors", framework="pt") as saved:
            missing = needed - set(saved.keys())
        if missing:
            raise ValueError(f"{path} does not fit this model: {len(missing)} parameters "
                             f"missing, e.g. {sorted(missing)[0]}")
        weights = load_file(path / "weights.safetensors")
        with torch.no_grad():
            for piece in self.pieces:
                self.params[piece.megatron].copy_(shard(piece, weights, self.layout,
                                                        self.tp_rank))
        state = json.loads((path / "state.json").read_text())
        self.optimizer.state.clear()
        self.optimizer.zero_grad(set_to_none=True)
        if not optimizer:
            return TrainingState(step=self.step, data_position=int(state["data_position"]))
        saved_state = torch.load(path / "optimizer.pt", weights_only=False)
        named = saved_state["optimizer"]["state"]
        if any(not isinstance(name, str) for name in named):
            raise ValueError(f"{path} holds an optimizer state without parameter names (an "
                             f"older checkpoint): resume it with trainer.backend=torch")
        for piece in self.pieces:
            entries = [named.get(name) for name in piece.hf]
            if any(entry is None for entry in entries):
                continue
            moments = {key: shard(piece, {n: e[key] for n, e in zip(piece.hf, entries,
                                                                     strict=True)},
                                  self.layout, self.tp_rank).to(self.device)
                       for key in ("exp_avg", "exp_avg_sq")}
            self.optimizer.state[self.params[piece.megatron]] = {
                "step": entries[0]["step"].clone(), **moments}
        set_rng_state(saved_state["rng"], self.rank)
        self.step = int(state["step"])
        return TrainingState(step=self.step, data_position=int(state["data_position"]))
