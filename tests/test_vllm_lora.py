"""LoRA runs push adapters to vLLM, not merged weights: a real vLLM with runtime LoRA, the
project's torch trainer with adapters, the project's client in between."""

from __future__ import annotations

import asyncio

import pytest
import torch

from skyrl_agent.backends.backend import Datum
from skyrl_agent.backends.torch_backend import TorchBackend
from skyrl_agent.inference.client import InferenceClient, Sampling
from skyrl_agent.inference.vllm.launch import VLLMOptions, vllm_server
from skyrl_agent.model.loading import LoraSettings
from tests.inference_helpers import max_abs_diff, until_generated

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def folder_bytes(folder) -> int:
    return sum(path.stat().st_size for path in folder.iterdir())


def _perturbed(backend: TorchBackend, std: float) -> dict[str, torch.Tensor]:
    """Move the adapters off where they are (as training would); their new values."""
    with torch.no_grad():
        for name, param in backend.model.named_parameters():
            if "lora_B" in name:
                param.add_(torch.randn_like(param) * std)
    return {name: p.detach().clone() for name, p in backend.model.named_parameters()
            if "lora_B" in name}


def _set(backend: TorchBackend, values: dict[str, torch.Tensor]) -> None:
    params = dict(backend.model.named_parameters())
    with torch.no_grad():
        for name, value in values.items():
            params[name].copy_(value)


def _scored(backend: TorchBackend, prompt: list[int], tokens) -> list[float]:
    sequence = prompt + list(tokens)
    datum = Datum(tuple(sequence[:-1]), {"target_tokens": tuple(sequence[1:])})
    (logprobs,) = backend.forward([datum])
    return list(logprobs[len(prompt) - 1:])


async def test_lora_updates_move_adapters_and_every_token_is_its_versions(smollm2_dir,
                                                                          tmp_path):
    """The trainer's adapters (moved as training would) reach vLLM as a PEFT folder, twice,
    each time with a generation in flight. vLLM keeps an in-flight request on the adapter it
    was sent with (the base model for the first), so all its tokens are that version's: they
    say so and match the trainer at that version within 1e-3, while a request sent after the
    load samples the new one. The bytes moved are the adapters', a fraction of the merged
    layers'. Stops: an adapter not applied, tokens labelled with a version that did not
    sample them, an adapter folder rewritten under a reader, a merged file sent."""
    backend = TorchBackend(smollm2_dir, lora=LoraSettings(rank=8), device="cpu",
                           dtype="float32")
    server = vllm_server(VLLMOptions(model=str(smollm2_dir), max_model_len=1024, lora_rank=8),
                         log_path=tmp_path / "vllm.log")
    server.start()
    prompt = [1, 9690, 198, 504, 3458, 282, 4649, 314]
    sampling = Sampling(max_tokens=96, temperature=1.0, ignore_eos=True)
    try:
        async with InferenceClient([server.url], api_keys=[server.api_key]) as client:
            updates, outputs, adapters = [], [], []
            for version in (1, 2):
                adapters.append(_perturbed(backend, 0.02))
                update = backend.save_weights_for_sampler(version)
                assert update.adapter is not None
                updates.append((folder_bytes(update.adapter), update.path.stat().st_size))
                task = asyncio.create_task(client.complete(prompt, sampling))
                await until_generated(server, 8)
                await client.update_weights(str(update.path), version, update.changed,
                                            str(update.adapter))
                outputs.append(await task)
            after = await client.complete(prompt, Sampling(max_tokens=16, temperature=1.0))
    finally:
        server.stop()
    try:
        first, second = outputs
        assert set(first.token_policy_versions) == {0}
        base = TorchBackend(smollm2_dir, device="cpu", dtype="float32")
        assert max_abs_diff(first.logprobs, _scored(base, prompt, first.token_ids)) < 1e-3
        base.close()
        assert set(second.token_policy_versions) == {1}
        assert set(after.token_policy_versions) == {2}
        assert max_abs_diff(after.logprobs, _scored(backend, prompt, after.token_ids)) < 1e-3
        _set(backend, adapters[0])
        assert max_abs_diff(second.logprobs, _scored(backend, prompt, second.token_ids)) < 1e-3
    finally:
        backend.close()
    assert all(adapter * 4 < merged for adapter, merged in updates), updates  # merged layers


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
