"""Hugging Face Llama-layout and Qwen3-MoE weights <-> megatron-core GPTModel shards.

Each Megatron parameter is one `Piece`: the Hugging Face tensors it holds and how a rank's shard
is cut from them. The cuts (Megatron's local layer spec, `rotary_interleaved=False`, so HF's
rotate-half needs no permutation of q and k):
- `qkv`: q, k and v fused per key-value group, [q of the group's heads, k, v] -> rows; a rank's
  shard is a plain row chunk, since whole groups go to each rank.
- `fc1`: SwiGLU's gate and up; a rank holds [its chunk of gate; its chunk of up].
- `columns`: a column chunk (the row-parallel output projections).
- `vocab`: embedding or output rows, padded with zero rows to a multiple of the TP size.
- `replicated`: norms (and an MoE's routers and query/key norms), whole on every rank.
- `expert`: one expert's slice of Hugging Face's stacked [experts, out, in] weight; Megatron's
  SequentialMLP holds each local expert as its own linear_fc1 (gate then up, as in Hugging
  Face's gate_up_proj) and linear_fc2. Expert-parallel rank r holds experts r*E/ep ... .
The same cuts apply to anything shaped like a parameter (gradients, Adam's moments).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

KINDS = ("qkv", "fc1", "columns", "vocab", "replicated", "expert")


@dataclass(frozen=True)
class Layout:
    """The model's shape, as the cuts need it."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    tp: int
    experts: int = 0
    """Routed experts per MoE layer (0: a dense model)."""
    ep: int = 1
    """Expert-parallel ranks the experts are split over."""

    @property
    def padded_vocab(self) -> int:
        return -(-self.vocab // self.tp) * self.tp

    @property
    def local_experts(self) -> int:
        return self.experts // self.ep

    @classmethod
    def of(cls, config: Any, tp: int, ep: int = 1) -> Layout:
        """From a Hugging Face config."""
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // \
            config.num_attention_heads
        return cls(config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
                   config.num_key_value_heads, head_dim, config.vocab_size,
                   bool(config.tie_word_embeddings), tp,
                   int(getattr(config, "num_experts", 0) or 0), ep)


def unsupported(config: Any, tp: int, ep: int = 1) -> str | None:
    """Why this Hugging Face config cannot run as a GPTModel at tensor parallel `tp` and expert
    parallel `ep`, or None."""
    kind = getattr(config, "model_type", None)
    if kind not in ("llama", "qwen3_moe"):
        return (f"the megatron backend maps Llama-layout and Qwen3-MoE models only; this one is "
                f"{kind or 'unknown'!r} (use trainer.backend=fsdp)")
    if kind == "qwen3_moe":
        problem = _unsupported_moe(config, tp, ep)
        if problem:
            return problem
    elif ep > 1:
        return f"trainer.expert_parallel={ep} needs a mixture-of-experts model"
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        return "the megatron backend maps Llama models without biases only"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"the megatron backend needs SwiGLU (silu), not {config.hidden_act}"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if rope.get("rope_type", "default") != "default":
        return f"the megatron backend has no {rope['rope_type']!r} RoPE scaling"
    for name, count in (("attention heads", config.num_attention_heads),
                        ("key-value heads", config.num_key_value_heads)):
        if count % tp:
            return (f"trainer.tensor_parallel={tp} must divide the model's {count} {name} "
                    f"(e.g. {', '.join(str(d) for d in range(1, count + 1) if count % d == 0)})")
    return None


def _unsupported_moe(config: Any, tp: int, ep: int) -> str | None:
    if tp > 1:
        return ("MoE models run on the megatron backend with tensor_parallel=1: split the "
                "experts with trainer.expert_parallel instead")
    if getattr(config, "mlp_only_layers", None) or getattr(config, "decoder_sparse_step", 1) != 1:
        return "the megatron backend maps Qwen3-MoE models whose every layer is MoE only"
    if config.num_experts % ep:
        return (f"trainer.expert_parallel={ep} must divide the model's {config.num_experts} "
                f"experts")
    return None


def rope_theta(config: Any) -> float:
    rope = getattr(config, "rope_parameters", None) or {}
    return float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


@dataclass(frozen=True)
class Piece:
    """One Megatron parameter and the Hugging Face tensors it holds."""

    megatron: str
    hf: tuple[str, ...]
    kind: str
    expert: int = 0
    """`expert` pieces: which expert of the stacked Hugging Face tensor."""


def pieces(layout: Layout, ep_rank: int = 0) -> list[Piece]:
    """Every Megatron parameter of expert-parallel rank `ep_rank`'s model, in the order Hugging
    Face names them (an MoE layer's local experts in order, fc1s then fc2s)."""
    out = [Piece("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), "vocab")]
    for i in range(layout.layers):
        hf, mc = f"model.layers.{i}.", f"decoder.layers.{i}."
        out += [
            Piece(f"{mc}input_layernorm.weight", (f"{hf}input_layernorm.weight",), "replicated"),
            Piece(f"{mc}self_attention.linear_qkv.weight",
                  tuple(f"{hf}self_attn.{p}_proj.weight" for p in "qkv"), "qkv"),
        ]
        if layout.experts:  # Qwen3's RMSNorm of each head's query and key
            out += [Piece(f"{mc}self_attention.{p}_layernorm.weight",
                          (f"{hf}self_attn.{p}_norm.weight",), "replicated") for p in "qk"]
        out += [
            Piece(f"{mc}self_attention.linear_proj.weight", (f"{hf}self_attn.o_proj.weight",),
                  "columns"),
            Piece(f"{mc}pre_mlp_layernorm.weight", (f"{hf}post_attention_layernorm.weight",),
                  "replicated"),
        ]
        out += _moe_pieces(layout, ep_rank, hf, mc) if layout.experts else [
            Piece(f"{mc}mlp.linear_fc1.weight",
                  (f"{hf}mlp.gate_proj.weight", f"{hf}mlp.up_proj.weight"), "fc1"),
            Piece(f"{mc}mlp.linear_fc2.weight", (f"{hf}mlp.down_proj.weight",), "columns"),
        ]
    out.append(Piece("decoder.final_layernorm.weight", ("model.norm.weight",), "replicated"))
    if not layout.tied:
        out.append(Piece("output_layer.weight", ("lm_head.weight",), "vocab"))
    return out


def _moe_pieces(layout: Layout, ep_rank: int, hf: str, mc: str) -> list[Piece]:
    first = ep_rank * layout.local_experts
    out = [Piece(f"{mc}mlp.router.weight", (f"{hf}mlp.gate.weight",), "replicated")]
    for megatron, stacked in (("linear_fc1", "gate_up_proj"), ("linear_fc2", "down_proj")):
        out += [Piece(f"{mc}mlp.experts.local_experts.{j}.{megatron}.weight",
                      (f"{hf}mlp.experts.{stacked}",), "expert", first + j)
                for j in range(layout.local_experts)]
    return out


def shard(piece: Piece, tensors: dict[str, torch.Tensor], layout: Layout,
          rank: int) -> torch.Tensor:
    """Rank `rank`'s shard of `piece`, cut from its full Hugging Face tensors."""
    tp = layout.tp
    parts = [tensors[name] for name in piece.hf]
    if piece.kind == "replicated":
        return parts[0].clone()
    if piece.kind == "expert":
        return parts[0][piece.expert].clone()
    if piece.kind == "columns":
        return parts[0].chunk(tp, dim=1)[rank].clone()
    if piece.kind == "vocab":
        table = parts[0]
        padding = table.new_zeros(layout.padded_vocab - table.shape[0], *table.shape[1:])
        return torch.cat([table, padding]).chunk(tp)[rank].clone()
    if piece.kind == "fc1":
        gate, up = parts
        return torch.cat([gate.chunk(tp)[rank], up.chunk(tp)[rank]])
    if piece.kind == "qkv":
        return _fused_qkv(parts, layout).chunk(tp)[rank].clone()
    raise ValueError(f"unknown piece kind {piece.kind!r}")


def unshard(piece: Piece, shards: list[torch.Tensor], layout: Layout) -> dict[str, torch.Tensor]:
    """The full Hugging Face tensors of `piece` from every rank's shard (in rank order); for an
    `expert` piece, every expert's slice in expert order."""
    if piece.kind == "expert":
        return {piece.hf[0]: torch.stack(shards)}
    if piece.kind == "replicated":
        return {piece.hf[0]: shards[0]}
    if piece.kind == "vocab":
        return {piece.hf[0]: torch.cat(shards)[: layout.vocab]}
    if piece.kind == "columns":
        return {piece.hf[0]: torch.cat(shards, dim=1)}
    if piece.kind == "fc1":
        halves = [s.chunk(2) for s in shards]
        return {piece.hf[0]: torch.cat([h[0] for h in halves]),
                piece.hf[1]: torch.cat([h[1] for h in halves])}
    if piece.kind == "qkv":
        groups, per_group = layout.kv_heads, layout.heads // layout.kv_heads
        fused = torch.cat(shards).view(groups, (per_group + 2) * layout.head_dim, layout.hidden)
        q, k, v = fused.split([per_group * layout.head_dim, layout.head_dim, layout.head_dim],
                              dim=1)
        return {name: part.reshape(-1, layout.hidden)
                for name, part in zip(piece.hf, (q, k, v), strict=True)}
    raise ValueError(f"unknown piece kind {piece.kind!r}")


def _fused_qkv(parts: list[torch.Tensor], layout: Layout) -> torch.Tensor:
    q, k, v = parts
    groups, hidden, head_dim = layout.kv_heads, layout.hidden, layout.head_dim
    return torch.cat([q.view(groups, -1, hidden), k.view(groups, head_dim, hidden),
                      v.view(groups, head_dim, hidden)], dim=1).reshape(-1, hidden)
