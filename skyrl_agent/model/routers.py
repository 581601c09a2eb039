"""The routers of a mixture-of-experts model: which experts they chose (the sampler records it)
and the replay of a recorded choice (the trainer's forward).

Rollout Routing Replay (R3; Ma et al. 2025, "Stabilizing MoE Reinforcement Learning by Aligning
Training and Inference Routers", arXiv 2510.23027): the trainer routes every token to the experts
the sampler chose, but computes the gating weights itself from its own router logits over those
experts, g = softmax(s)[chosen] (renormalized over the chosen k when the model normalizes its
top-k), so the router still receives gradient. Only the choice is replayed.

Supported routers compute softmax, then top-k (Qwen2-MoE, Qwen3-MoE, OLMoE, Mixtral in
transformers). Each returns (router_logits, top-k weights, top-k indices) for the flattened
[tokens, hidden] input, which is what the hooks here read and rewrite.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

SOFTMAX_TOP_K = {
    "Qwen2MoeTopKRouter": True, "Qwen3MoeTopKRouter": True, "OlmoeTopKRouter": True,
    "MixtralTopKRouter": False,
}
"""Router classes whose gating is softmax then top-k; the value: whether the top-k weights are
renormalized only when the router's `norm_topk_prob` says so (Mixtral always renormalizes)."""


def find_routers(model: Any) -> list[torch.nn.Module]:
    """The model's MoE routers in layer order; empty for a dense model. A router of a kind the
    replay does not know is refused by name rather than replayed wrongly."""
    found = []
    for name, module in model.named_modules():
        kind = type(module).__name__
        if not kind.endswith("TopKRouter"):
            continue
        if kind not in SOFTMAX_TOP_K:
            raise ValueError(f"{name} is a {kind}; routing replay knows softmax top-k routers "
                             f"only ({', '.join(SOFTMAX_TOP_K)})")
        found.append(module)
    return found


def normalizes(router: torch.nn.Module) -> bool:
    """Whether the router renormalizes its top-k weights to sum to 1."""
    if not SOFTMAX_TOP_K[type(router).__name__]:
        return True
    return bool(getattr(router, "norm_topk_prob", False))


class RoutingTap:
    """Records the experts every router chooses in each forward of `model` (the sampler's side).

    The hooks stay on the model; `take()` returns the rows of the forwards since the last call.
    """

    def __init__(self, model: Any) -> None:
        self.routers = find_routers(model)
        self._chosen: list[torch.Tensor] = []
        self._handles = [r.register_forward_hook(self._record) for r in self.routers]

    @property
    def active(self) -> bool:
        """Whether the model has routers at all."""
        return bool(self.routers)

    def _record(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self._chosen.append(output[2].detach())

    def take(self) -> np.ndarray:
        """[tokens, layers, top_k] expert ids of the last forward (one per router call)."""
        chosen, self._chosen = self._chosen, []
        if len(chosen) != len(self.routers):
            raise RuntimeError(f"{len(chosen)} router calls recorded for {len(self.routers)} "
                               f"routers: take() must follow each forward")
        return torch.stack(chosen, dim=1).to("cpu", torch.int32).numpy()

    def discard(self) -> None:
        self._chosen.clear()

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


@dataclass
class ReplayCount:
    """How often the trainer's own choice differed from the replayed one."""

    decisions: int = 0
    """(token, layer) routing decisions replayed."""
    differing: int = 0
    """Of those, the ones where the trainer's own top-k set differs from the recorded set."""

    @property
    def share(self) -> float:
        return self.differing / self.decisions if self.decisions else 0.0

    def reset(self) -> None:
        self.decisions = self.differing = 0


@contextlib.contextmanager
def replayed_routing(model: Any, experts_NLK: torch.Tensor, count: ReplayCount | None = None,
                     replay: bool = True) -> Iterator[None]:
    """Within the block, the forward of `model` over N flattened token positions routes each
    position to `experts_NLK[n, layer]` (its recorded experts); a row of -1 (nothing recorded,
    such as padding or the final token) keeps the model's own choice. With `replay=False` the
    model routes itself and only `count` is kept (to measure the disagreement R3 removes).

    Gating weights come from the model's own router logits over the replayed experts (see the
    module's docstring), so gradients reach the router weights.
    """
    routers = find_routers(model)
    if experts_NLK.shape[1] != len(routers):
        raise ValueError(f"the recorded routing covers {experts_NLK.shape[1]} MoE layers; "
                         f"this model has {len(routers)}")

    def hook_for(layer: int) -> Any:
        def rewrite(module: torch.nn.Module, args: Any, output: Any) -> Any:
            logits_NE, _, own_NK = output
            recorded_NK = experts_NLK[:, layer].to(own_NK.device)
            if recorded_NK.shape != own_NK.shape:
                raise ValueError(f"recorded routing of {tuple(recorded_NK.shape)} for a router "
                                 f"output of {tuple(own_NK.shape)} (tokens x top-k)")
            known_N = (recorded_NK >= 0).all(dim=-1)
            if count is not None:
                same_N = (own_NK.sort(-1).values == recorded_NK.sort(-1).values).all(-1)
                count.decisions += int(known_N.sum())
                count.differing += int((~same_N & known_N).sum())
            if not replay:
                return None
            chosen_NK = torch.where(known_N[:, None], recorded_NK.long(), own_NK)
            probs_NE = torch.softmax(logits_NE.float(), dim=-1)
            weights_NK = probs_NE.gather(-1, chosen_NK)
            if normalizes(module):
                weights_NK = weights_NK / weights_NK.sum(dim=-1, keepdim=True)
            return logits_NE, weights_NK.to(output[1].dtype), chosen_NK

        return rewrite

    handles = [r.register_forward_hook(hook_for(i)) for i, r in enumerate(routers)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
