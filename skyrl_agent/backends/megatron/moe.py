"""megatron-core's MoE layer for a Qwen3-MoE model: its config, its spec on CPU ranks, and
Rollout Routing Replay inside its router.

On CPU (gloo) the stock layer stops at three CUDA-only spots, avoided without patching
megatron's code:
- the router's gating moves its weight to the current CUDA device (router.py, `gating`): the
  spec takes our router subclass instead;
- with expert parallelism, the all-to-all dispatcher creates a CUDA stream when it is built
  (token_dispatcher.py, `MoEAlltoAllTokenDispatcher.__init__`, guarded by a class attribute):
  we set that attribute, once, before building;
- the dropless all-to-all gathers its split sizes into CUDA buffers (tensor_parallel/mappings.py,
  `_gather_along_first_dim`): on CPU the dispatcher runs in drop-and-pad mode with a capacity of
  every local token (factor experts / top-k), which drops nothing, so the results are exact, at
  experts / top-k times the expert compute. On GPUs the dropless path runs as is.

Replay: megatron's top-k routing asks the router's `router_replay` object for the top-k
(moe_utils.topk_routing_with_score_function). `ReplayedTopK` answers with the sampler's recorded
experts where there is a record and the router's own choice elsewhere; the gating weights are
then computed from the router's own scores over those experts, as in the torch backend.
"""

from __future__ import annotations

from typing import Any

import torch
from megatron.core.transformer.moe.moe_utils import router_gating_linear
from megatron.core.transformer.moe.router import TopKRouter

from skyrl_agent.backends.megatron.mapping import Layout
from skyrl_agent.model.routers import ReplayCount


class HostTopKRouter(TopKRouter):
    """TopKRouter whose gating leaves the router weight where it is (the CPU)."""

    def gating(self, input: torch.Tensor) -> torch.Tensor:
        dtype = {"fp32": torch.float32, "fp64": torch.float64}.get(
            self.config.moe_router_dtype, input.dtype)
        return router_gating_linear(input, self.weight, self.bias, dtype)


class ReplayedTopK:
    """The top-k of one router: the recorded experts (`recorded_NK`, -1 rows: none) or its own."""

    def __init__(self, count: ReplayCount, replay: bool) -> None:
        self.count = count
        self.replay = replay
        self.recorded_NK: torch.Tensor | None = None

    def get_replay_topk(self, scores: torch.Tensor, topk: int, num_groups: int | None,
                        group_topk: int | None, compute_topk: Any,
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        values, own_NK = compute_topk(scores, topk, num_groups, group_topk)
        recorded_NK = self.recorded_NK
        if recorded_NK is None:
            return values, own_NK
        recorded_NK = recorded_NK.to(own_NK.device)
        known_N = (recorded_NK >= 0).all(-1)
        same_N = (own_NK.sort(-1).values == recorded_NK.sort(-1).values).all(-1)
        self.count.decisions += int(known_N.sum())
        self.count.differing += int((~same_N & known_N).sum())
        if not self.replay:
            return values, own_NK
        chosen_NK = torch.where(known_N[:, None], recorded_NK.long(), own_NK)
        return scores.gather(1, chosen_NK), chosen_NK


def moe_settings(config: Any, layout: Layout, on_cpu: bool) -> dict[str, Any]:
    """TransformerConfig fields of the model's MoE layers."""
    settings: dict[str, Any] = dict(
        num_moe_experts=layout.experts, moe_router_topk=config.num_experts_per_tok,
        moe_ffn_hidden_size=config.moe_intermediate_size, qk_layernorm=True,
        expert_model_parallel_size=layout.ep, moe_router_load_balancing_type="none",
        moe_aux_loss_coeff=0.0, moe_grouped_gemm=False, moe_permute_fusion=False,
        moe_router_fusion=False,
        # Qwen3's norm_topk_prob: softmax over the chosen k (renormalized), not over all.
        moe_router_pre_softmax=not config.norm_topk_prob,
        moe_token_dispatcher_type="allgather" if layout.ep == 1 else "alltoall")
    if on_cpu and layout.ep > 1:
        settings.update(moe_expert_capacity_factor=layout.experts / config.num_experts_per_tok,
                        moe_pad_expert_input_to_capacity=True)
        from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher

        # Its constructor makes a CUDA stream unless this is already set; it is never used on
        # CPU (the drop-and-pad mode skips the device-to-host sync it is for).
        MoEAlltoAllTokenDispatcher.cuda_dtoh_stream = object()
    return settings


def use_host_router(spec: Any) -> None:
    """Give the MoE layer of `spec` our router (the stock one moves its weight to CUDA)."""
    spec.submodules.mlp.keywords["submodules"].router = HostTopKRouter


def attach_replay(model: Any, count: ReplayCount, replay: bool) -> list[ReplayedTopK]:
    """A ReplayedTopK on every router of `model`, in layer order."""
    hooks = []
    for layer in model.decoder.layers:
        hook = ReplayedTopK(count, replay)
        layer.mlp.router.router_replay = hook
        hooks.append(hook)
    return hooks
