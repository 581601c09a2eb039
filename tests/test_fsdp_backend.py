"""The FSDP2 backend (two gloo ranks on CPU) against the one-process torch backend on the same
tiny model: every loss gives the same logprobs, loss, gradient and step; checkpoints resume
exactly, across a kill and across backends; LoRA weights reach the sampler merged; bad input is
refused as the one-process backend refuses it, and a dead rank ends the call instead of hanging."""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from skyrl_agent.trainers.backend import AdamParams, Datum
from skyrl_agent.trainers.batch import groups_to_batch
from skyrl_agent.trainers.fsdp_backend import FsdpBackend
from skyrl_agent.trainers.loss import LOSS_FNS
from skyrl_agent.trainers.ranks import RankError
from skyrl_agent.trainers.torch_backend import TorchBackend
from skyrl_agent.trainers.torch_model import LoraSettings
from tests.test_trainer import groups, sample
from tests.tiny_models import char_model_dir

ADAM = AdamParams(learning_rate=1e-2, grad_clip_norm=1.0)


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


def test_every_loss_gives_the_one_process_logprobs_gradient_and_step(char_model):
    """Stops: gradients averaged over ranks instead of summed (each rank's loss is already its
    share of the whole batch), a stand-in micro-batch that adds to the loss, rows lost or doubled
    by the split, reductions computed per rank instead of over the batch."""
    one = TorchBackend(char_model)
    sharded = FsdpBackend(char_model, world_size=2, micro_batch_tokens=24)
    try:
        for step, loss_fn in enumerate(LOSS_FNS):
            data = batch(step)
            config = {"reduction": "seq-mean-token-mean" if step % 2 else "token-mean"}
            if loss_fn == "ppo":
                config["kl_coef"] = 0.1  # the KL reference is sharded too
            expected = one.forward_backward(data, loss_fn, config)
            got = sharded.forward_backward(data, loss_fn, config)
            assert closest(got.logprobs, expected.logprobs) <= 1e-5, loss_fn
            assert got.loss == pytest.approx(expected.loss, rel=1e-5, abs=1e-6), loss_fn
            assert got.metrics.keys() == expected.metrics.keys()
            for key, value in expected.metrics.items():  # clip fractions, entropy, agreement
                if loss_fn == "gspo" and key == "clip_fraction":
                    continue  # a share of sequences, token-weighted across micro-batches
                assert got.metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
            grads = {n: p.grad for n, p in one.params.items()}
            assert max_gap(grads, sharded.full_tensors("grads")) <= 1e-4, loss_fn
            assert sharded.optim_step(ADAM).metrics["grad_norm"] == pytest.approx(
                one.optim_step(ADAM).metrics["grad_norm"], rel=1e-4)
            assert max_gap(dict(one.params), sharded.full_tensors("params")) <= 1e-4, loss_fn
        assert sharded.step == one.step == len(LOSS_FNS)
        assert closest(sharded.forward(batch(9)), one.forward(batch(9))) <= 1e-5
    finally:
        sharded.close()


def test_resume_is_exact_after_the_ranks_are_killed_and_on_the_other_backend(char_model,
                                                                             tmp_path):
    """Stops: a checkpoint that holds one rank's shard, or loses the optimizer moments, and a
    dead rank that leaves the driver waiting forever for its peer's collective."""
    first = FsdpBackend(char_model, world_size=2, micro_batch_tokens=24)
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

    resumed = FsdpBackend(char_model, world_size=2, micro_batch_tokens=24, seed=9)
    try:
        state = resumed.load_state(tmp_path / "ckpt")
        assert (state.step, state.data_position) == (1, 1)
        assert resumed.forward_backward(batch(2), "ppo").loss == loss
        resumed.optim_step(ADAM)
        assert max_gap(after, resumed.full_tensors("params")) == 0.0
    finally:
        resumed.close()

    elsewhere = TorchBackend(char_model)  # the same checkpoint, one process
    elsewhere.load_state(tmp_path / "ckpt")
    assert elsewhere.forward_backward(batch(2), "ppo").loss == pytest.approx(loss, rel=1e-6)
    elsewhere.optim_step(ADAM)
    assert max_gap(after, dict(elsewhere.params)) <= 1e-6


def test_lora_weights_for_the_sampler_are_merged_from_every_shard(char_model, tmp_path):
    """Stops: a sampler file holding rank 0's shard of each tensor, or the adapters unmerged."""
    lora = LoraSettings(rank=4, alpha=8)
    one = TorchBackend(char_model, lora=lora)
    sharded = FsdpBackend(char_model, world_size=2, lora=lora)
    try:
        for backend in (one, sharded):
            backend.forward_backward(batch(4), "importance_sampling")
            backend.optim_step(ADAM)
        expected, update = one.save_weights_for_sampler(1), sharded.save_weights_for_sampler(1)
        served, published = load_file(expected.path), load_file(update.path)
        assert published.keys() == served.keys() and len(served) > 0
        assert max_gap(served, published) <= 1e-5
        base = load_file(Path(char_model) / "model.safetensors")
        assert max_gap({n: base[n] for n in served}, published) > 1e-4  # the update is in
        sharded.export(tmp_path / "exported")
        assert closest(TorchBackend(tmp_path / "exported").forward(batch(5)),
                       one.forward(batch(5))) <= 1e-5
    finally:
        one.close()
        sharded.close()
    assert not update.path.exists()  # closing the ranks removes their shared-memory file


def test_bad_input_is_refused_like_the_one_process_backend_and_the_ranks_live_on(char_model,
                                                                                tmp_path):
    sharded = FsdpBackend(char_model, world_size=2)
    try:
        with pytest.raises(ValueError, match="unknown loss_fn 'ppo2'"):
            sharded.forward_backward(batch(0), "ppo2")
        adapters_only = TorchBackend(char_model, lora=LoraSettings(rank=2))
        adapters_only.save_state(tmp_path / "other-ckpt")
        with pytest.raises(ValueError, match="does not fit this model"):
            sharded.load_state(tmp_path / "other-ckpt")
        one_row = [Datum(*_row(sample(random.Random(0), 0, 1.0)))]
        assert len(sharded.forward(one_row)[0]) == len(one_row[0].model_input)  # rank 1 idles
    finally:
        sharded.close()


def _row(trajectory) -> tuple:
    turn = trajectory.segments[0].turns[0]
    ids = (*turn.prompt_ids, *turn.completion_ids)
    return ids[:-1], {"target_tokens": tuple(float(t) for t in ids[1:])}
