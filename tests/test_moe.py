"""Mixture-of-experts models on the same path as dense ones: a tiny Qwen3-MoE served with
logprobs and its routing (through the prefix cache), stored in Parquet, and replayed by the
trainers (Rollout Routing Replay, R3)."""

from __future__ import annotations

import asyncio
import pickle
import urllib.request

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoModelForCausalLM

from skyrl_agent.backends.torch_backend import TorchBackend
from skyrl_agent.data.schema import from_row, to_table
from skyrl_agent.inference.client import InferenceClient
from skyrl_agent.inference.process import embedded_server
from skyrl_agent.llm.session import LLMSession, SessionConfig
from skyrl_agent.model.routers import ReplayCount, RoutingTap, find_routers, replayed_routing
from skyrl_agent.rl.batch import trajectory_data
from skyrl_agent.types import FinishReason, Reward, RoutedExperts, Segment, Trajectory, Turn
from tests.tiny_models import char_model_dir, char_moe_dir, char_tokenizer

pytestmark = pytest.mark.slow
EXPERTS, TOP_K, LAYERS = 8, 2, 2


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return char_moe_dir(tmp_path_factory.mktemp("moe"), experts=EXPERTS, top_k=TOP_K,
                        layers=LAYERS)


@pytest.fixture(scope="module")
def moe_server(moe_dir):
    with embedded_server(str(moe_dir)) as process:
        yield process.url


def _own_routing(model, sequence: list[int]) -> np.ndarray:
    """[tokens, layers, top_k]: the experts `model` routes each token of `sequence` to."""
    tap = RoutingTap(model)
    with torch.no_grad():
        model(input_ids=torch.tensor([sequence]))
    chosen = tap.take()
    tap.close()
    return chosen


async def _two_turns(url: str) -> tuple[Trajectory, list[int]]:
    """A two-turn session on the server (the second turn served from the prefix cache); the
    trajectory and the server's routing of the last call's whole sequence."""
    tokenizer = char_tokenizer()
    async with InferenceClient([url], routed_experts=True) as client:
        session = LLMSession(client, tokenizer, SessionConfig(max_tokens=24), seed=3)
        await session.chat([{"role": "system", "content": "You route."},
                            {"role": "user", "content": "Say something about experts."}])
        await session.chat([{"role": "user", "content": "And once more, please."}])
        segments = session.segments
    trajectory = Trajectory("moe/t", 0, "test", segments, Reward(1.0), FinishReason.STOP)
    return trajectory, list(segments[0].turns[-1].prompt_ids)


def test_tiny_moe_serves_logprobs_and_the_routing_of_every_position(moe_server, moe_dir):
    """The server reports, for every position it ran the model on, the experts each layer chose;
    a prompt served from the prefix cache still gets the cached positions' routing; and the
    routing is what the same weights choose when the whole sequence is run at once."""
    trajectory, _ = asyncio.run(_two_turns(moe_server))
    first, second = trajectory.segments[0].turns
    assert first.routed_experts is not None and second.routed_experts is not None
    assert first.routed_experts.start == 0
    assert first.routed_experts.end == len(first.prompt_ids) + len(first.completion_ids) - 1
    # The second turn stores only the positions the first did not.
    assert second.routed_experts.start == first.routed_experts.end
    assert second.routed_experts.end == len(second.prompt_ids) + len(second.completion_ids) - 1
    assert (first.routed_experts.layers, first.routed_experts.top_k) == (LAYERS, TOP_K)

    model = AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32).eval()
    sequence = list(second.prompt_ids + second.completion_ids)
    own = _own_routing(model, sequence[:-1])
    served = np.concatenate([first.routed_experts.array(), second.routed_experts.array()])
    assert served.shape == own.shape
    assert (np.sort(served, -1) == np.sort(own, -1)).all()
    assert served.max() < EXPERTS and len(np.unique(served)) > TOP_K

    backend = TorchBackend(moe_dir, dtype="float32")
    [datum] = trajectory_data(trajectory, 1.0)
    [trainer] = backend.forward([datum])
    sampled = [i for i, w in enumerate(datum.loss_fn_inputs["weights"]) if w]
    gap = max(abs(trainer[i] - datum.loss_fn_inputs["logprobs"][i]) for i in sampled)
    assert gap <= 1e-3, gap


def test_a_dense_model_refuses_to_report_routing(tmp_path):
    """Stops a client from believing it records routing it never gets: the dense model's server
    answers 400 in one line."""
    with embedded_server(str(char_model_dir(tmp_path / "dense"))) as process:
        request = urllib.request.Request(
            f"{process.url}/v1/completions", method="POST",
            data=b'{"prompt": [5, 6, 7], "max_tokens": 2, "return_routed_experts": true}',
            headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request)
        assert refused.value.code == 400
        assert b"no MoE router layers" in refused.value.read()


def test_recorded_routing_round_trips_through_parquet(tmp_path):
    """One-byte ids (<= 256 experts) and two-byte ids (more) come back from a Parquet shard
    bit for bit, with their positions."""
    rng = np.random.default_rng(0)
    small = RoutedExperts.from_array(rng.integers(0, 64, (5, 3, 4)), start=2)
    large = RoutedExperts.from_array(rng.integers(0, 512, (4, 3, 4)), start=7)
    assert (small.width, large.width) == (1, 2)
    turns = tuple(Turn(tuple(range(n)), (1, 2), (-0.5, -0.25), (1, 1), 0, FinishReason.STOP,
                       routed_experts=r) for n, r in ((3, small), (9, large)))
    trajectory = Trajectory("moe/t", 0, "test", (Segment(turns),), Reward(0.0),
                            FinishReason.STOP)
    pq.write_table(to_table([trajectory]), tmp_path / "shard.parquet")
    [row] = pq.read_table(tmp_path / "shard.parquet").to_pylist()
    back = from_row(row).segments[0].turns
    assert [t.routed_experts for t in back] == [small, large]
    assert (back[1].routed_experts.array() == large.array()).all()
    assert back[1].routed_experts.start == 7 and back[1].routed_experts.end == 11


def test_replay_routes_every_token_to_the_recorded_experts(moe_dir, tmp_path):
    """Replay uses the sampler's choice at every position, not the trainer's own (a trainer
    whose routers differ chooses other experts for most tokens), and its gating weights are the
    trainer's softmax over the replayed experts, so the router still gets a gradient."""
    sampler = AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32).eval()
    trainer = AutoModelForCausalLM.from_pretrained(
        char_moe_dir(tmp_path / "other", seed=1, experts=EXPERTS, top_k=TOP_K, layers=LAYERS),
        dtype=torch.float32).eval()
    sequence = list(range(10, 70))
    recorded = _own_routing(sampler, sequence)
    recorded[-1] = -1  # nothing recorded for the last position: the trainer routes it itself
    own = _own_routing(trainer, sequence)

    used: list[torch.Tensor] = []
    weights: list[torch.Tensor] = []

    def seen(module, args, output) -> None:  # what the expert layer was given
        used.append(args[1].detach())
        weights.append(args[2])

    hooks = [layer.mlp.experts.register_forward_hook(seen) for layer in trainer.model.layers]
    count = ReplayCount()
    with replayed_routing(trainer, torch.from_numpy(recorded), count):
        logits = trainer(input_ids=torch.tensor([sequence])).logits
    for hook in hooks:
        hook.remove()

    replayed = torch.stack(used, dim=1).numpy()
    assert (replayed[:-1] == recorded[:-1]).all()
    assert (replayed[-1] == own[-1]).all()
    differing = (np.sort(own[:-1], -1) != np.sort(recorded[:-1], -1)).any(-1)
    assert differing.mean() > 0.5
    assert count.decisions == (len(sequence) - 1) * LAYERS
    assert count.differing == int(differing.sum())

    router = find_routers(trainer)[0]
    hidden = {}

    def logits_of(module, args, output) -> None:
        hidden["logits"] = output[0]

    handle = router.register_forward_hook(logits_of)
    with replayed_routing(trainer, torch.from_numpy(recorded)):
        trainer(input_ids=torch.tensor([sequence]))
    handle.remove()
    probs = torch.softmax(hidden["logits"].float(), -1).gather(
        -1, torch.from_numpy(recorded[:-1, 0]).long())
    expected = probs / probs.sum(-1, keepdim=True)
    assert torch.allclose(weights[0][:-1], expected, atol=1e-6)

    logits.log_softmax(-1)[0, :-1].gather(-1, torch.tensor(sequence[1:])[:, None]).sum().backward()
    assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0


def test_torch_and_fsdp_backends_train_the_moe_on_the_served_routing(moe_server, moe_dir):
    """Both backends replay the routing the server recorded (at matching numerics the trainer's
    own choice agrees everywhere), agree with the sampler's logprobs to 1e-3, agree with each
    other, and an optimizer step moves the routers and the experts."""
    from skyrl_agent.backends.backend import AdamParams
    from skyrl_agent.backends.fsdp_backend import FsdpBackend

    trajectory, _ = asyncio.run(_two_turns(moe_server))
    data = trajectory_data(trajectory, 1.0)
    assert data[0].routed_experts is not None
    assert (data[0].routed_experts[:-1] >= 0).all()  # every position recorded but the last

    torch_backend = TorchBackend(moe_dir, dtype="float32", routing_replay=True)
    fsdp = FsdpBackend(moe_dir, world_size=2, dtype="float32", routing_replay=True)
    try:
        outputs = [b.forward_backward(data, "importance_sampling") for b in (torch_backend, fsdp)]
        for out in outputs:
            assert out.metrics["routing/differing"] == 0.0
            assert out.metrics["agreement/max_abs_diff"] <= 1e-3
        for a, b in zip(outputs[0].logprobs[0], outputs[1].logprobs[0], strict=True):
            assert abs(a - b) <= 1e-5
        before = {n: p.detach().clone() for n, p in torch_backend.model.named_parameters()}
        torch_backend.optim_step(AdamParams(learning_rate=1e-2))
        fsdp.optim_step(AdamParams(learning_rate=1e-2))
        after = dict(torch_backend.model.named_parameters())
        for part in ("mlp.gate.weight", "mlp.experts.gate_up_proj"):
            name = f"model.layers.0.{part}"
            assert not torch.equal(before[name], after[name]), name
        trained = fsdp.full_tensors()
        for name, tensor in trained.items():
            assert torch.allclose(tensor, after[name].detach(), atol=1e-5), name
    finally:
        fsdp.close()
        torch_backend.close()


def test_lora_adapts_attention_and_every_expert_and_serves_merged(moe_dir):
    """LoRA on the MoE puts one low-rank pair on each expert weight (peft's parameter
    adapters) beside the attention projections; after a step the merged weights the sampler
    gets differ from the base in those tensors only, and they compute what the adapted model
    computes."""
    from skyrl_agent.backends.backend import AdamParams, Datum
    from skyrl_agent.model.loading import LoraSettings

    backend = TorchBackend(moe_dir, dtype="float32", lora=LoraSettings(rank=4, alpha=8))
    adapted = {n.split(".lora_")[0] for n in backend.params}
    assert any(n.endswith("mlp.experts") for n in adapted), adapted
    assert any(n.endswith("self_attn.q_proj") for n in adapted), adapted
    sequence = list(range(10, 40))
    datum = Datum(tuple(sequence[:-1]), {
        "target_tokens": tuple(sequence[1:]), "weights": (1.0,) * 29,
        "advantages": (1.0,) * 29, "logprobs": (-4.6,) * 29})
    for _ in range(2):  # B starts at 0, so A moves from the second step on
        backend.forward_backward([datum], "importance_sampling")
        backend.optim_step(AdamParams(learning_rate=5e-2))
    merged = backend.save_weights_for_sampler(1)
    base = AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32).eval()
    from safetensors.torch import load_file

    published = load_file(merged.path)
    assert {"model.layers.0.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj",
            "model.layers.0.self_attn.q_proj.weight"} <= set(published)
    assert not any("embed" in n or "norm" in n or "mlp.gate" in n for n in published)
    for name, tensor in published.items():
        assert not torch.equal(tensor, base.get_parameter(name).detach()), name
    with torch.no_grad():
        for name, tensor in published.items():
            base.get_parameter(name).copy_(tensor)
    served = base(input_ids=torch.tensor([sequence])).logits.log_softmax(-1)[0, :-1]
    served = served.gather(-1, torch.tensor(sequence[1:])[:, None]).squeeze(-1)
    [trainer] = backend.forward([datum])
    assert max(abs(a - b) for a, b in zip(served.tolist(), trainer, strict=True)) <= 1e-4
    backend.close()


def test_an_update_after_the_first_carries_only_the_experts_that_moved(moe_dir):
    """A short sequence reaches only some experts; AdamW leaves the others exactly as they
    were, so after the first (whole) update the next ones name only the moved expert rows
    (and the dense tensors), move fewer bytes, and the server still ends up with exactly the
    trainer's weights."""
    from skyrl_agent.backends.backend import AdamParams, Datum

    sequence = [20, 21, 22, 23]  # three input tokens: at most 6 of 8 experts per layer
    datum = Datum(tuple(sequence[:-1]), {
        "target_tokens": tuple(sequence[1:]), "weights": (1.0,) * 3,
        "advantages": (1.0,) * 3, "logprobs": (-4.6,) * 3})
    backend = TorchBackend(moe_dir, dtype="float32")

    async def served(client: InferenceClient) -> tuple[Datum, tuple[float, ...]]:
        """A sample of the served weights, as a datum, and the server's logprobs of it."""
        from skyrl_agent.inference.client import Sampling

        prompt = list(range(10, 40))
        out = await client.complete(prompt, Sampling(max_tokens=24, seed=5))
        sequence = prompt + list(out.token_ids)
        return Datum(tuple(sequence[:-1]), {
            "target_tokens": tuple(sequence[1:])}), out.logprobs

    async def steps(url: str, key: str | None) -> list:
        updates = []
        async with InferenceClient([url], api_keys=[key]) as client:
            for version in (1, 2, 3):
                backend.forward_backward([datum], "importance_sampling")
                backend.optim_step(AdamParams(learning_rate=1e-2))
                update = backend.save_weights_for_sampler(version)
                await client.update_weights(str(update.path), version, update.changed)
                updates.append(update)
            return updates, await served(client)

    try:
        with embedded_server(str(moe_dir)) as server:  # its own: the weights change
            updates, (sample, sampled) = asyncio.run(steps(server.url, server.api_key))
        first, *later = updates
        assert first.changed is None
        for update in later:
            assert update.changed is not None and update.nbytes < first.nbytes
            experts = {n: r for n, r in update.changed.rows.items() if ".experts." in n}
            assert experts and all(r is not None and 0 < len(r) < EXPERTS
                                   for r in experts.values())
            assert update.changed.rows["model.layers.0.self_attn.q_proj.weight"] is None
            # It crosses processes (Ray's router actor): it must survive plain pickling.
            assert pickle.loads(pickle.dumps(update.changed)) == update.changed
        [trainer] = backend.forward([sample])
        trained = trainer[-len(sampled):]
        assert max(abs(a - b) for a, b in zip(sampled, trained, strict=True)) <= 1e-4
    finally:
        backend.close()


def test_routing_replay_on_a_dense_model_and_expert_adapters_on_fsdp_are_one_line_errors(
        tmp_path, moe_dir):
    """Stops a run from starting servers and trainers for a combination it cannot honour."""
    from tests.test_cli import assert_one_line_error, run

    dense = run("train", "--tasks", "toy", "--set", "trainer.routing_replay=true",
                "--output", str(tmp_path / "dense"))
    assert_one_line_error(dense, "trainer.routing_replay needs a mixture-of-experts model")
    fsdp = run("train", "--tasks", "toy", "--set", f"inference.model={moe_dir}",
               "--set", "trainer.backend=fsdp", "--set", "trainer.data_parallel=2",
               "--set", "trainer.lora_rank=4", "--output", str(tmp_path / "fsdp"))
    assert_one_line_error(fsdp, "needs trainer.backend=torch")


def test_a_lora_update_names_only_the_experts_whose_adapters_moved(moe_dir):
    """With LoRA the sampler gets merged weights; an expert whose adapter rows never moved keeps
    its merged slice, so the update leaves it out. Applying the named rows to the previous
    update gives exactly the new one (nothing that moved is missed)."""
    from safetensors.torch import load_file

    from skyrl_agent.backends.backend import AdamParams, Datum
    from skyrl_agent.model.loading import LoraSettings

    sequence = [20, 21, 22, 23]  # three input tokens: at most 6 of 8 experts per layer
    datum = Datum(tuple(sequence[:-1]), {
        "target_tokens": tuple(sequence[1:]), "weights": (1.0,) * 3,
        "advantages": (1.0,) * 3, "logprobs": (-4.6,) * 3})
    backend = TorchBackend(moe_dir, dtype="float32", lora=LoraSettings(rank=4, alpha=8))
    try:
        published = []
        for version in (1, 2):
            backend.forward_backward([datum], "importance_sampling")
            backend.optim_step(AdamParams(learning_rate=1e-2))
            update = backend.save_weights_for_sampler(version)
            published.append((update, load_file(update.path)))
        (first, before), (second, after) = published
        assert first.changed is None and second.changed is not None
        rows = second.changed.rows
        experts = {n: r for n, r in rows.items() if ".experts." in n}
        assert experts and all(r is not None and 0 < len(r) < EXPERTS
                               for r in experts.values())
        assert second.nbytes < first.nbytes
        rebuilt = {n: t.clone() for n, t in before.items()}
        for name, picked in rows.items():
            if picked is None:
                rebuilt[name] = after[name]
            else:
                rebuilt[name][list(picked)] = after[name][list(picked)]
        assert all(torch.equal(rebuilt[n], after[n]) for n in after)
    finally:
        backend.close()
