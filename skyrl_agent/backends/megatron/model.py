"""A megatron-core GPTModel for a Hugging Face Llama-layout model, runnable on CPU.

Built from megatron-core's local layer spec (no Transformer Engine), specialised only through
its extension points: the core attention is given through the spec (`SdpaAttention`, torch's
fused attention: the stock module takes its scratch buffer from a CUDA memory pool), and on CPU
the model's RoPE module is our subclass (the stock one moves its table to the current CUDA
device). Dropout is 0, so the no-op RNG tracker is exact. Nothing global is patched.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig

from skyrl_agent.backends.megatron.mapping import Layout, rope_theta


class SdpaAttention(MegatronModule):
    """Causal core attention by `scaled_dot_product_attention`, with grouped keys and values.

    Rows are right-padded, so causal attention alone keeps padding out of every real position:
    the mask Megatron passes is not needed."""

    def __init__(self, config: TransformerConfig, layer_number: int, attn_mask_type: Any,
                 attention_type: str, attention_dropout: float | None = None,
                 softmax_scale: float | None = None, cp_comm_type: str | None = None,
                 pg_collection: Any = None) -> None:
        super().__init__(config=config)
        self.softmax_scale = softmax_scale

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, attn_mask_type: Any = None,
                attention_bias: Any = None, packed_seq_params: Any = None) -> torch.Tensor:
        # Megatron's [sequence, batch, heads, head_dim] -> torch's [batch, heads, sequence, dim]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True,
                                             scale=self.softmax_scale)
        sequence, batch = query.shape[0], query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(sequence, batch, -1)


class HostRotaryEmbedding(RotaryEmbedding):
    """RoPE whose tables stay on the device of its frequencies (the CPU)."""

    def get_emb(self, max_seq_len: int, offset: int = 0) -> torch.Tensor:
        freqs = self.get_freqs_non_repeated(max_seq_len, offset)
        return torch.cat((freqs, freqs), dim=-1)[:, None, None, :]  # rotate-half layout


def build_gpt(config: Any, layout: Layout, dtype: torch.dtype, on_cpu: bool) -> GPTModel:
    """An uninitialised GPTModel shard of this rank (weights are loaded after); a Qwen3-MoE's
    layers are megatron's MoE layers (see `moe`)."""
    from skyrl_agent.backends.megatron.moe import moe_settings, use_host_router

    moe = moe_settings(config, layout, on_cpu) if layout.experts else {}
    transformer = TransformerConfig(
        num_layers=layout.layers, hidden_size=layout.hidden,
        num_attention_heads=layout.heads, num_query_groups=layout.kv_heads,
        kv_channels=layout.head_dim, ffn_hidden_size=config.intermediate_size,
        normalization="RMSNorm", layernorm_epsilon=config.rms_norm_eps, gated_linear_unit=True,
        activation_func=F.silu, add_bias_linear=False, hidden_dropout=0.0,
        attention_dropout=0.0, tensor_model_parallel_size=layout.tp, sequence_parallel=False,
        params_dtype=dtype, use_cpu_initialization=True, perform_initialization=False,
        masked_softmax_fusion=False, bias_activation_fusion=False, bias_dropout_fusion=False,
        apply_rope_fusion=False, gradient_accumulation_fusion=False, persist_layer_norm=False,
        **moe)
    spec = get_gpt_layer_local_spec(normalization="RMSNorm", num_experts=layout.experts or None,
                                    moe_grouped_gemm=False, qk_layernorm=bool(layout.experts))
    spec.submodules.self_attention.submodules.core_attention = SdpaAttention
    if layout.experts and on_cpu:
        use_host_router(spec)
    model = GPTModel(transformer, spec, vocab_size=layout.padded_vocab,
                     max_sequence_length=config.max_position_embeddings, pre_process=True,
                     post_process=True, parallel_output=True,
                     share_embeddings_and_output_weights=layout.tied,
                     position_embedding_type="rope", rotary_base=rope_theta(config))
    if on_cpu:
        model.rotary_pos_emb = HostRotaryEmbedding(
            kv_channels=layout.head_dim, rotary_percent=1.0, rotary_base=rope_theta(config),
            use_cpu_initialization=True)
    return model
