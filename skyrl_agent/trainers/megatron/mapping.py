"""Hugging Face Llama-layout weights <-> megatron-core GPTModel tensor-parallel shards.

Each Megatron parameter is one `Piece`: the Hugging Face tensors it holds and how a rank's shard
is cut from them. The cuts (Megatron's local layer spec, `rotary_interleaved=False`, so HF's
rotate-half needs no permutation of q and k):
- `qkv`: q, k and v fused per key-value group, [q of the group's heads, k, v] -> rows; a rank's
  shard is a plain row chunk, since whole groups go to each rank.
- `fc1`: SwiGLU's gate and up; a rank holds [its chunk of gate; its chunk of up].
- `columns`: a column chunk (the row-parallel output projections).
- `vocab`: embedding or output rows, padded with zero rows to a multiple of the TP size.
- `replicated`: norms, whole on every rank.
The same cuts apply to anything shaped like a parameter (gradients, Adam's moments).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

KINDS = ("qkv", "fc1", "columns", "vocab", "replicated")


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

    @property
    def padded_vocab(self) -> int:
        return -(-self.vocab // self.tp) * self.tp

    @classmethod
    def of(cls, config: Any, tp: int) -> Layout:
        """From a Hugging Face config."""
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // \
            config.num_attention_heads
        return cls(config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
                   config.num_key_value_heads, head_dim, config.vocab_size,
                   bool(config.tie_word_embeddings), tp)


def unsupported(config: Any, tp: int) -> str | None:
    """Why this Hugging Face config cannot run as a GPTModel at tensor parallel `tp`, or None."""
    if getattr(config, "model_type", None) != "llama":
        return (f"the megatron backend maps Llama-layout models only; this one is "
                f"{getattr(config, 'model_type', 'unknown')!r} (use trainer.backend=fsdp)")
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


def rope_theta(config: Any) -> float:
    rope = getattr(config, "rope_parameters", None) or {}
    return float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


@dataclass(frozen=True)
class Piece:
    """One Megatron parameter and the Hugging Face tensors it holds."""

    megatron: str
    hf: tuple[str, ...]
    kind: str


def pieces(layout: Layout) -> list[Piece]:
    """Every Megatron parameter of the model, in the order Hugging Face names them."""
    out = [Piece("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), "vocab")]
    for i in range(layout.layers):
        hf, mc = f"model.layers.{i}.", f"decoder.layers.{i}."
        out += [
            Piece(f"{mc}input_layernorm.weight", (f"{hf}input_layernorm.weight",), "replicated"),
            Piece(f"{mc}self_attention.linear_qkv.weight",
                  tuple(f"{hf}self_attn.{p}_proj.weight" for p in "qkv"), "qkv"),
            Piece(f"{mc}self_attention.linear_proj.weight", (f"{hf}self_attn.o_proj.weight",),
                  "columns"),
            Piece(f"{mc}pre_mlp_layernorm.weight", (f"{hf}post_attention_layernorm.weight",),
                  "replicated"),
            Piece(f"{mc}mlp.linear_fc1.weight",
                  (f"{hf}mlp.gate_proj.weight", f"{hf}mlp.up_proj.weight"), "fc1"),
            Piece(f"{mc}mlp.linear_fc2.weight", (f"{hf}mlp.down_proj.weight",), "columns"),
        ]
    out.append(Piece("decoder.final_layernorm.weight", ("model.norm.weight",), "replicated"))
    if not layout.tied:
        out.append(Piece("output_layer.weight", ("lm_head.weight",), "vocab"))
    return out


def shard(piece: Piece, tensors: dict[str, torch.Tensor], layout: Layout,
          rank: int) -> torch.Tensor:
    """Rank `rank`'s shard of `piece`, cut from its full Hugging Face tensors."""
    tp = layout.tp
    parts = [tensors[name] for name in piece.hf]
    if piece.kind == "replicated":
        return parts[0].clone()
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
    """The full Hugging Face tensors of `piece` from every rank's shard (in rank order)."""
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
