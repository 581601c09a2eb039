"""Megatron's MoE layers against the torch backend, with one rank and with the experts split
over two (expert parallelism over gloo), both replaying the same recorded routing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from skyrl_agent.backends.torch_backend import TorchBackend
from tests.test_moe import EXPERTS, LAYERS, TOP_K, _own_routing
from tests.tiny_models import char_moe_dir

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return char_moe_dir(tmp_path_factory.mktemp("moe"), experts=EXPERTS, top_k=TOP_K,
                        layers=LAYERS)


def _replay_batch(moe_dir, tmp_path) -> list:
    """Four rows of uneven length whose recorded routing comes from another model (its
    routers choose other experts for almost every token), the last position unrecorded."""
    from skyrl_agent.backends.backend import Datum

    other = AutoModelForCausalLM.from_pretrained(
        char_moe_dir(tmp_path / "other", seed=1, experts=EXPERTS, top_k=TOP_K, layers=LAYERS),
        dtype=torch.float32).eval()
    rng = np.random.default_rng(0)
    data = []
    for n in (20, 13, 17, 9):
        sequence = rng.integers(8, 100, n).tolist()
        routed = _own_routing(other, sequence[:-1])
        routed[-1] = -1
        data.append(Datum(tuple(sequence[:-1]), {
            "target_tokens": tuple(sequence[1:]), "weights": (1.0,) * (n - 1),
            "advantages": (float(rng.choice((-1.0, 1.0))),) * (n - 1),
            "logprobs": (-4.6,) * (n - 1)}, routed_experts=routed))
    return data


@pytest.mark.parametrize("expert_parallel", [1, 2])
def test_megatron_moe_matches_the_torch_backend_replaying_the_same_routing(
        moe_dir, tmp_path, expert_parallel):
    """megatron-core's MoE layer (our router on CPU; with two ranks the experts split between
    them and tokens exchanged by all-to-all) replays the recorded experts exactly as the torch
    backend does: the same logprobs, the same step, and checkpoints and sampler weights in the
    Hugging Face names (stacked experts). Stops: experts cut from the wrong rows, an expert's
    gradient summed over ranks that already hold every token's share, the replay applied in
    Megatron's sequence-major token order as if it were batch-major."""
    from safetensors.torch import load_file

    from skyrl_agent.backends.backend import AdamParams
    from skyrl_agent.backends.megatron.backend import MegatronBackend

    data = _replay_batch(moe_dir, tmp_path)
    one = TorchBackend(moe_dir, dtype="float32", routing_replay=True)
    megatron = MegatronBackend(moe_dir, tensor_parallel=1, data_parallel=expert_parallel,
                               expert_parallel=expert_parallel, dtype="float32",
                               micro_batch_tokens=40, routing_replay=True)
    try:
        expected = one.forward_backward(data, "importance_sampling")
        got = megatron.forward_backward(data, "importance_sampling")
        assert expected.metrics["routing/differing"] > 0.5  # the replay changes most choices
        gap = max(abs(a - b) for ra, rb in zip(expected.logprobs, got.logprobs, strict=True)
                  for a, b in zip(ra, rb, strict=True))
        assert gap <= 1e-5, gap
        adam = AdamParams(learning_rate=1e-2, grad_clip_norm=1.0)
        assert one.optim_step(adam).metrics["grad_norm"] == pytest.approx(
            megatron.optim_step(adam).metrics["grad_norm"], rel=1e-5)
        trained = dict(one.model.named_parameters())
        weights = megatron.full_tensors("params")
        assert set(weights) == set(trained)
        assert max(float((trained[n].detach() - w).abs().max())
                   for n, w in weights.items()) <= 1e-6
        megatron.save_state(tmp_path / "checkpoint")
        published = load_file(megatron.save_weights_for_sampler(1).path)
        assert published["model.layers.1.mlp.experts.down_proj"].shape[0] == EXPERTS
        assert torch.equal(published["model.layers.1.mlp.experts.down_proj"],
                           weights["model.layers.1.mlp.experts.down_proj"])
        resumed = TorchBackend(moe_dir, dtype="float32")
        resumed.load_state(tmp_path / "checkpoint")
        assert all(torch.equal(p.detach(), weights[n])
                   for n, p in resumed.model.named_parameters())
    finally:
        megatron.close()
