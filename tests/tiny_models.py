"""Tiny randomly initialized models for tests that must train in seconds on a CPU.

`char_model_dir` builds a character-level tokenizer (printable ASCII plus a few chat tokens, ~100
ids) with a chat template, and a small Llama over it, saved as a Hugging Face folder the embedded
server and the trainer both load. A small vocabulary makes a random policy's per-character
choices dense enough for a toy RL task to give signal from the first step.
"""

from __future__ import annotations

from pathlib import Path

CHAT_TOKENS = ("<|pad|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>")
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def char_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 127)] + ["\n", "\t"]
    vocab = {token: i for i, token in enumerate([*CHAT_TOKENS, "<|unk|>", *chars])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<|unk|>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(list(CHAT_TOKENS))
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|end|>",
                                   pad_token="<|pad|>", unk_token="<|unk|>",
                                   chat_template=CHAT_TEMPLATE)


def char_model_dir(folder: Path, seed: int = 0, hidden: int = 32, layers: int = 1) -> Path:
    """Save a random Llama over the character tokenizer into `folder`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = char_tokenizer()
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden,
                         intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=1024, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
    folder.mkdir(parents=True, exist_ok=True)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def tiny_llama_dir(folder: Path, tokenizer_dir: Path, max_positions: int = 512) -> Path:
    """Save a random 2-layer Llama over the tokenizer in `tokenizer_dir` into `folder`: real
    code paths at a real vocabulary, in under a second."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=max_positions,
                         eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=tokenizer.bos_token_id, tie_word_embeddings=True)
    folder.mkdir(parents=True, exist_ok=True)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def char_moe_dir(folder: Path, seed: int = 0, hidden: int = 32, layers: int = 2,
                 experts: int = 8, top_k: int = 2, router_std: float = 0.5,
                 embedding_std: float | None = None, head_dim: int | None = None) -> Path:
    """Save a random Qwen3-MoE over the character tokenizer into `folder`: every layer a sparse
    MoE block (`experts` experts, `top_k` routed per token), the layout of Qwen3-30B-A3B. A small
    `router_std` leaves router logits close together: near-ties that numerics can flip. LoRA
    cannot change the (tied) embedding, which bounds the logits' range: `embedding_std` above
    the default 0.02 gives adapters room to make one character likely. `head_dim` (default
    hidden // 4) is free of `hidden` in Qwen3: vLLM-CPU's attention needs at least 32."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    tokenizer = char_tokenizer()
    torch.manual_seed(seed)
    config = Qwen3MoeConfig(vocab_size=len(tokenizer), hidden_size=hidden,
                            intermediate_size=2 * hidden, moe_intermediate_size=hidden,
                            num_hidden_layers=layers, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=head_dim or hidden // 4,
                            num_experts=experts,
                            num_experts_per_tok=top_k, norm_topk_prob=True,
                            max_position_embeddings=1024, eos_token_id=tokenizer.eos_token_id,
                            pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
    model = Qwen3MoeForCausalLM(config)
    with torch.no_grad():  # transformers starts routers at zero: every expert ties
        for name, param in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                param.normal_(0.0, router_std)
            if embedding_std is not None and name.endswith("embed_tokens.weight"):
                param.normal_(0.0, embedding_std)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


IMAGE_TOKEN = "<image>"
VLM_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for part in m['content'] %}"
    "{% if part['type'] == 'image' %}<image>{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def char_vlm_dir(folder: Path, seed: int = 0, hidden: int = 32, image_size: int = 32,
                 patch_size: int = 8) -> Path:
    """Save a random LLaVA (a CLIP vision tower, a projector, a Llama) over the character
    tokenizer plus an `<image>` token, with its processor, into `folder`: a standard HF
    vision-language architecture small enough to train on a CPU in seconds. An image becomes
    (image_size / patch_size)^2 image tokens."""
    import torch
    from transformers import (
        CLIPImageProcessorPil,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    tokenizer = char_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    tokenizer.chat_template = VLM_CHAT_TEMPLATE
    text = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden,
                       intermediate_size=2 * hidden, num_hidden_layers=1, num_attention_heads=4,
                       num_key_value_heads=2, max_position_embeddings=1024,
                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                       tie_word_embeddings=True)
    vision = CLIPVisionConfig(hidden_size=hidden, intermediate_size=2 * hidden,
                              num_hidden_layers=1, num_attention_heads=4, image_size=image_size,
                              patch_size=patch_size, projection_dim=hidden)
    config = LlavaConfig(vision_config=vision, text_config=text,
                         image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
                         vision_feature_layer=-1, vision_feature_select_strategy="default",
                         tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config)
    images = CLIPImageProcessorPil(size={"shortest_edge": image_size},
                                crop_size={"height": image_size, "width": image_size})
    processor = LlavaProcessor(image_processor=images, tokenizer=tokenizer, patch_size=patch_size,
                               vision_feature_select_strategy="default",
                               chat_template=VLM_CHAT_TEMPLATE, image_token=IMAGE_TOKEN,
                               num_additional_image_tokens=1)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def png(color: tuple[int, int, int], size: tuple[int, int] = (40, 30)) -> bytes:
    """A solid-colour PNG."""
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format="PNG")
    return out.getvalue()
