"""The sharded backends — FSDP2 over two gloo ranks, Megatron at tensor parallel 2 — against the
one-process torch backend on the same tiny model (its 103-token vocabulary does not split in two:
Megatron pads it): every loss gives the same logprobs, loss, gradient and step; checkpoints resume
exactly, across a kill and across backends; sampler weights and exports are the whole model;
bad input is refused as the one-process backend refuses it, and a dead rank ends the call
instead of hanging."""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from skyrl_agent.backends.backend import AdamParams, Datum
from skyrl_agent.backends.fsdp_backend import FsdpBackend
from skyrl_agent.backends.loss import LOSS_FNS
from skyrl_agent.backends.megatron.backend import MegatronBackend
from skyrl_agent.backends.ranks import RankError
from skyrl_agent.backends.torch_backend import TorchBackend
from skyrl_agent.model.loading import LoraSettings
from skyrl_agent.rl.batch import groups_to_batch
from tests.test_trainer import groups, sample
from tests.tiny_models import char_model_dir

ADAM = AdamParams(learning_rate=1e-2, grad_clip_norm=1.0)
SHARDED = ["fsdp", "megatron"]


def sharded(kind: str, model: Path, **settings):
    """Two ranks: FSDP2 shards of the whole model, or Megatron's tensor-parallel halves."""
    if kind == "fsdp":
        return FsdpBackend(model, world_size=2, **settings)
    return MegatronBackend(model, tensor_parallel=2, **settings)


@pytest.fixture(scope="module")
def char_model(tmp_path_factory):
    return char_model_dir(tmp_path_factory.mktemp("char-model"), layers=2)


def batch(seed: int) -> list[Datum]:
    """Seven rows of uneven length: the two ranks get different numbers of micro-batches."""
    rng = random.Random(seed)
    data = list(groups_to_batch(groups(seed) + groups(seed + 100), "grpo").data)
    rng.shuffle(data)
    return data[:7]


def closest(a: list[tuple[float, ...]], b: list[tuple[float, ...]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True)
               for x, y in zip(ra, rb, strict=True))


def max_gap(one: dict[str, torch.Tensor], other: dict[str, torch.Tensor]) -> float:
    assert one.keys() == other.keys()
    return max(float((one[n].detach() - other[n]).abs().max()) for n in one)


@pytest.mark.parametrize("kind", SHARDED)
def test_every_loss_gives_the_one_process_logprobs_gradient_and_step(char_model, kind):
    """Stops: gradients averaged over ranks instead of summed (each rank's loss is already its
    share of the whole batch), a stand-in micro-batch that adds to the loss, rows lost or doubled
    by the split, reductions computed per rank instead of over the batch; for Megatron, a wrong
    cut of fused QKV or SwiGLU weights, padding rows of the vocabulary in the softmax, a gradient
    norm that counts replicated norms once per rank."""
    one = TorchBackend(char_model)
    backend = sharded(kind, char_model, micro_batch_tokens=24)
    try:
        for step, loss_fn in enumerate(LOSS_FNS):
            data = batch(step)
            config = {"reduction": "seq-mean-token-mean" if step % 2 else "token-mean"}
            if loss_fn == "ppo":
                config["kl_coef"] = 0.1  # the KL reference is sharded too
            expected = one.forward_backward(data, loss_fn, config)
            got = backend.forward_backward(data, loss_fn, config)
            assert closest(got.logprobs, expected.logprobs) <= 1e-5, loss_fn
            assert got.loss == pytest.approx(expected.loss, rel=1e-5, abs=1e-6), loss_fn
            assert got.metrics.keys() == expected.metrics.keys()
            for key, value in expected.metrics.items():  # clip fractions, entropy, agreement
                if loss_fn == "gspo" and key == "clip_fraction":
                    continue  # a share of sequences, token-weighted across micro-batches
                assert got.metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
            grads = {n: p.grad.clone() for n, p in one.params.items()}
            got_grads = backend.full_tensors("grads")
            assert backend.optim_step(ADAM).metrics["grad_norm"] == pytest.approx(
                one.optim_step(ADAM).metrics["grad_norm"], rel=1e-4)
            # Read after the step on purpose: what a call returned is the caller's own copy,
            # not a window on the rank's live gradient (which the step's clip scales in place).
            assert max_gap(grads, got_grads) <= 1e-4, loss_fn
            assert max_gap(dict(one.params), backend.full_tensors("params")) <= 1e-4, loss_fn
        assert backend.step == one.step == len(LOSS_FNS)
        assert closest(backend.forward(batch(9)), one.forward(batch(9))) <= 1e-5
    finally:
        backend.close()


@pytest.mark.parametrize("kind", SHARDED)
def test_resume_is_exact_after_the_ranks_are_killed_and_on_the_other_backend(char_model,
                                                                             tmp_path, kind):
    """Stops: a checkpoint that holds one rank's shard, or loses the optimizer moments, and a
    dead rank that leaves the driver waiting forever for its peer's collective."""
    first = sharded(kind, char_model, micro_batch_tokens=24)
    try:
        first.forward_backward(batch(1), "ppo")
        first.optim_step(ADAM)
        first.save_state(tmp_path / "ckpt", data_position=1)
        loss = first.forward_backward(batch(2), "ppo").loss
        first.optim_step(ADAM)
        after = first.full_tensors("params")
        for process in first._ranks._processes:
            os.kill(process.pid, signal.SIGKILL)
        with pytest.raises(RankError, match="trainer ranks lost"):
            first.forward(batch(3))
    finally:
        first.close()

    resumed = sharded(kind, char_model, micro_batch_tokens=24, seed=9)
    try:
        state = resumed.load_state(tmp_path / "ckpt")
        assert (state.step, state.data_position) == (1, 1)
        assert resumed.forward_backward(batch(2), "ppo").loss == loss
        resumed.optim_step(ADAM)
        assert max_gap(after, resumed.full_tensors("params")) == 0.0
    finally:
        resumed.close()

    # The same checkpoint, one process: the weights and Adam's moments of each parameter are
    # those the one-process backend has after the same first step. (Its second step is not
    # compared: with eps 1e-12 Adam turns noise-level gradient differences into full steps.)
    elsewhere = TorchBackend(char_model)
    elsewhere.load_state(tmp_path / "ckpt")
    assert elsewhere.forward_backward(batch(2), "ppo").loss == pytest.approx(loss, rel=1e-6)
    own = TorchBackend(char_model)
    own.forward_backward(batch(1), "ppo")
    own.optim_step(ADAM)
    assert max_gap(dict(own.params), dict(elsewhere.params)) <= 1e-5
    for name, param in own.params.items():
        moments = elsewhere.optimizer.state[elsewhere.params[name]]
        for key, value in own.optimizer.state[param].items():
            torch.testing.assert_close(moments[key], value, rtol=1e-4, atol=1e-8)


def test_lora_weights_for_the_sampler_are_merged_from_every_shard(char_model, tmp_path):
    """Stops: a sampler file holding rank 0's shard of each tensor, or the adapters unmerged."""
    lora = LoraSettings(rank=4, alpha=8)
    one = TorchBackend(char_model, lora=lora)
    fsdp = FsdpBackend(char_model, world_size=2, lora=lora)
    try:
        for backend in (one, fsdp):
            backend.forward_backward(batch(4), "importance_sampling")
            backend.optim_step(ADAM)
        expected, update = one.save_weights_for_sampler(1), fsdp.save_weights_for_sampler(1)
        served, published = load_file(expected.path), load_file(update.path)
        assert published.keys() == served.keys() and len(served) > 0
        assert max_gap(served, published) <= 1e-5
        base = load_file(Path(char_model) / "model.safetensors")
        assert max_gap({n: base[n] for n in served}, published) > 1e-4  # the update is in
        fsdp.export(tmp_path / "exported")
        assert closest(TorchBackend(tmp_path / "exported").forward(batch(5)),
                       one.forward(batch(5))) <= 1e-5
    finally:
        one.close()
        fsdp.close()
    assert not update.path.exists()  # closing the ranks removes their shared-memory file


@pytest.mark.parametrize("kind", SHARDED)
def test_bad_input_is_refused_like_the_one_process_backend_and_the_ranks_live_on(char_model,
                                                                                tmp_path, kind):
    backend = sharded(kind, char_model)
    try:
        with pytest.raises(ValueError, match="unknown loss_fn 'ppo2'"):
            backend.forward_backward(batch(0), "ppo2")
        adapters_only = TorchBackend(char_model, lora=LoraSettings(rank=2))
        adapters_only.save_state(tmp_path / "other-ckpt")
        with pytest.raises(ValueError, match="does not fit this model"):
            backend.load_state(tmp_path / "other-ckpt")
        one_row = [Datum(*_row(sample(random.Random(0), 0, 1.0)))]
        assert len(backend.forward(one_row)[0]) == len(one_row[0].model_input)  # rank 1 idles
    finally:
        backend.close()


def _row(trajectory) -> tuple:
    turn = trajectory.segments[0].turns[0]
    ids = (*turn.prompt_ids, *turn.completion_ids)
    return ids[:-1], {"target_tokens": tuple(ids[1:])}


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_every_megatron_cut_puts_the_shards_back_together(char_model, tp):
    """Each piece of the Hugging Face model, cut into tp shards and joined again, is the tensor
    it was; at TP 2 a shard of the fused QKV holds whole key-value groups (its own heads)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from skyrl_agent.backends.megatron.mapping import Layout, pieces, shard, unshard

    config = AutoConfig.from_pretrained(char_model)
    layout = Layout.of(config, tp)
    weights = AutoModelForCausalLM.from_pretrained(char_model).state_dict()
    kinds = set()
    for piece in pieces(layout):
        kinds.add(piece.kind)
        shards = [shard(piece, weights, layout, rank) for rank in range(tp)]
        assert len({tuple(s.shape) for s in shards}) == 1
        for name, tensor in unshard(piece, shards, layout).items():
            assert torch.equal(tensor, weights[name]), name
    assert kinds == {"qkv", "fc1", "columns", "vocab", "replicated"}
    if tp == 2:
        qkv = next(p for p in pieces(layout) if p.kind == "qkv")
        group = layout.heads // layout.kv_heads * layout.head_dim  # a group's query rows
        first = shard(qkv, weights, layout, 0)
        q = weights[qkv.hf[0]]
        assert torch.equal(first[:group], q[:group])  # rank 0 starts with group 0's queries
        assert torch.equal(first[group: group + layout.head_dim],
                           weights[qkv.hf[1]][: layout.head_dim])  # then group 0's key


@pytest.mark.slow
def test_a_megatron_export_serves_what_the_trainer_computes(char_model, tmp_path):
    """TP 2 -> a Hugging Face folder -> the embedded server: the server's logprobs of its own
    samples are the trainer's (<= 1e-3), and the step moved them away from the base model."""
    import asyncio

    from skyrl_agent.inference.client import InferenceClient
    from skyrl_agent.inference.process import embedded_server
    from skyrl_agent.rl.batch import trajectory_data
    from tests.test_trainer import _one_turn, served_logprobs

    backend = MegatronBackend(char_model, tensor_parallel=2)
    prompt = [3, *range(40, 50), 1, 4]
    try:
        backend.forward_backward(batch(6), "importance_sampling")
        backend.optim_step(AdamParams(learning_rate=5e-2))
        backend.export(tmp_path / "exported")

        async def sample() -> tuple[tuple, tuple]:
            with embedded_server(str(tmp_path / "exported")) as server:
                async with InferenceClient([server.url], api_keys=[server.api_key]) as client:
                    return await served_logprobs(client, prompt)

        ids, logprobs = asyncio.run(sample())
        [datum] = trajectory_data(_one_turn(prompt, ids, logprobs), 1.0)
        [trainer] = backend.forward([datum])
    finally:
        backend.close()
    picked = [lp for lp, w in zip(trainer, datum.loss_fn_inputs["weights"], strict=True) if w]
    assert max(abs(a - b) for a, b in zip(picked, logprobs, strict=True)) <= 1e-3
    [base] = TorchBackend(char_model).forward([datum])
    assert max(abs(a - b) for a, b in zip(trainer, base, strict=True)) > 1e-3


@pytest.mark.slow
def test_megatron_data_parallel_copies_sum_their_gradients(char_model):
    """Two copies of a TP-2 model (four ranks), each on half the batch: the step is the one
    process's. Stops: copies that never exchange gradients, or average instead of sum."""
    one = TorchBackend(char_model)
    backend = MegatronBackend(char_model, tensor_parallel=2, data_parallel=2,
                              micro_batch_tokens=24)
    try:
        for step in range(2):
            data = batch(10 + step)
            expected = one.forward_backward(data, "ppo", {"reduction": "token-mean"})
            got = backend.forward_backward(data, "ppo", {"reduction": "token-mean"})
            assert got.loss == pytest.approx(expected.loss, rel=1e-5, abs=1e-6)
            assert backend.optim_step(ADAM).metrics["grad_norm"] == pytest.approx(
                one.optim_step(ADAM).metrics["grad_norm"], rel=1e-4)
        assert max_gap(dict(one.params), backend.full_tensors("params")) <= 1e-4
    finally:
        backend.close()



def test_ctrl_c_reaches_the_driver_alone_and_no_rank_outlives_it(char_model):
    """Ctrl-C signals the whole process group. Stops: ranks that die mid-call on it, each
    printing its own traceback over the run's output, instead of being stopped by the driver."""
    import subprocess
    import sys
    import time

    script = (
        "import time\n"
        "from skyrl_agent.backends.fsdp_backend import FsdpBackend\n"
        f"backend = FsdpBackend({str(char_model)!r}, world_size=2)\n"
        "print(' '.join(str(p.pid) for p in backend._ranks._processes), flush=True)\n"
        "try:\n"
        "    time.sleep(120)\n"
        "except KeyboardInterrupt:\n"
        "    print('driver interrupted', flush=True)\n"
        "    backend.close()\n")
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert process.stdout is not None
        ranks = [int(pid) for pid in process.stdout.readline().split()]
        assert len(ranks) == 2
        time.sleep(0.5)
        os.killpg(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert "driver interrupted" in out
    assert "KeyboardInterrupt" not in err, err
    deadline = time.monotonic() + 10
    while any(_running(pid) for pid in ranks) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_running(pid) for pid in ranks)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"  # an exited rank its parent has not reaped yet is gone all the same
