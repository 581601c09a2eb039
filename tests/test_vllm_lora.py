"""LoRA runs push adapters to vLLM, not merged weights: a real vLLM with runtime LoRA, the
project's torch trainer with adapters, the project's client in between."""

from __future__ import annotations

import pytest
import torch

from skyrl_agent.inference.client import InferenceClient, Sampling
from skyrl_agent.inference.vllm.launch import VLLMOptions, vllm_server
from skyrl_agent.trainers.backend import Datum
from skyrl_agent.trainers.torch_backend import TorchBackend
from skyrl_agent.trainers.torch_model import LoraSettings

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def folder_bytes(folder) -> int:
    return sum(path.stat().st_size for path in folder.iterdir())


async def test_a_lora_update_moves_the_adapter_and_serves_the_trained_policy(smollm2_dir,
                                                                             tmp_path):
    """The trainer's adapters (moved off zero, as training would) reach vLLM as a PEFT
    folder: what it samples afterwards, labelled with the new version, is the trainer's own
    policy within 1e-3, and the bytes moved are the adapters', a fraction of the merged
    layers'. Stops: an adapter not applied (base logprobs), applied twice over merged weights,
    unlabelled tokens, a merged file sent instead."""
    backend = TorchBackend(smollm2_dir, lora=LoraSettings(rank=8), device="cpu",
                           dtype="float32")
    with torch.no_grad():
        for name, param in backend.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.02)
    update = backend.save_weights_for_sampler(1)
    assert update.adapter is not None
    assert folder_bytes(update.adapter) * 4 < update.nbytes  # the merged layers' bytes
    server = vllm_server(VLLMOptions(model=str(smollm2_dir), max_model_len=1024, lora_rank=8),
                         log_path=tmp_path / "vllm.log")
    server.start()
    try:
        prompt = [1, 9690, 198, 504, 3458, 282, 4649, 314]
        sampling = Sampling(max_tokens=24, temperature=1.0, seed=3, ignore_eos=True)
        async with InferenceClient([server.url], api_keys=[server.api_key]) as client:
            before = await client.complete(prompt, sampling)
            await client.update_weights(str(update.path), 1, update.changed, str(update.adapter))
            after = await client.complete(prompt, sampling)
    finally:
        server.stop()
        backend.close()
    assert set(before.token_policy_versions) == {0} and set(after.token_policy_versions) == {1}
    base = TorchBackend(smollm2_dir, device="cpu", dtype="float32")
    for out, policy, other in ((after, backend, base), (before, base, backend)):
        sequence = prompt + list(out.token_ids)
        datum = Datum(tuple(sequence[:-1]), {"target_tokens": tuple(map(float, sequence[1:]))})
        (own,) = policy.forward([datum])
        (theirs,) = other.forward([datum])
        sampled = own[len(prompt) - 1:]
        assert max(abs(a - b) for a, b in zip(sampled, out.logprobs, strict=True)) < 1e-3
        assert max(abs(a - b) for a, b in zip(theirs[len(prompt) - 1:], out.logprobs,
                                                strict=True)) > 1e-2
    base.close()


def test_tinker_samples_its_trained_lora_through_vllm(smollm2_dir, tmp_path, monkeypatch):
    """`tinker-serve --engine vllm`: the real tinker SDK trains a LoRA model a step, saves it
    for sampling, and what vLLM samples from it is the training client's own policy within
    1e-3 (the merged adapted layers loaded whole), while the base model samples the base.
    Stops: a sampler that kept the base weights or another engine's."""
    import numpy as np
    import tinker

    from tests.tinker_server import SDK_ENV, start_server

    for key, value in SDK_ENV.items():
        monkeypatch.setenv(key, value)
    types = tinker.types
    process = start_server([f"smol={smollm2_dir}"], tmp_path / "data", tmp_path / "server.log",
                           extra=["--engine", "vllm"])
    try:
        service = tinker.ServiceClient(base_url=process.url, api_key=process.api_key)
        client = service.create_lora_training_client(base_model="smol", rank=8, seed=1).result()
        tokens = client.get_tokenizer().encode("The capital of France is Paris.")
        datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                            loss_fn_inputs={"target_tokens": np.asarray(tokens[1:]),
                                            "weights": np.ones(len(tokens) - 1)})
        client.forward_backward([datum], "cross_entropy").result()
        client.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        trained = client.save_weights_and_get_sampling_client().result()
        base = service.create_sampling_client(base_model="smol").result()
        prompt = tokens[:4]
        params = types.SamplingParams(max_tokens=8, temperature=1.0, seed=5)
        for sampler, same in ((trained, True), (base, False)):
            (sequence,) = sampler.sample(types.ModelInput.from_ints(prompt), 1, params
                                         ).result().sequences
            full = prompt + list(sequence.tokens)
            scored = client.forward([types.Datum(
                model_input=types.ModelInput.from_ints(full[:-1]),
                loss_fn_inputs={"target_tokens": np.asarray(full[1:])})], "cross_entropy"
            ).result().loss_fn_outputs[0]["logprobs"].to_numpy()[len(prompt) - 1:]
            gap = np.abs(np.asarray(sequence.logprobs) - scored).max()
            assert (gap < 1e-3) == same, gap
        service.close("success").result()
    finally:
        process.stop()
    assert "vllm" in (tmp_path / "data").joinpath("sampler-smol.log").read_text().lower()
