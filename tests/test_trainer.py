"""The torch backend on a tiny model: masked data moves nothing, resume is exact, LoRA weights
reach a real embedded server, and the sampler and the trainer agree on what was sampled."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from skyrl_agent.atomic import staging_path
from skyrl_agent.backends.torch_backend import TorchBackend
from skyrl_agent.config import RunConfig
from skyrl_agent.data.run_dir import RunDir
from skyrl_agent.inference.client import InferenceClient, Sampling
from skyrl_agent.inference.process import embedded_server
from skyrl_agent.model.loading import LoraSettings
from skyrl_agent.rl.batch import groups_to_batch, trajectory_data
from skyrl_agent.rl.checkpoints import Checkpoints, LoopState
from skyrl_agent.rl.step import train_on
from skyrl_agent.types import FinishReason, Reward, Segment, Trajectory, TrajectoryGroup, Turn
from tests.tiny_models import char_model_dir

CONFIG = RunConfig.model_validate({"trainer": {"learning_rate": 1e-2},
                                   "collector": {"n_samples_per_task": 4}})


@pytest.fixture(scope="module")
def char_model(tmp_path_factory):
    return char_model_dir(tmp_path_factory.mktemp("char-model"))


def sample(rng: random.Random, index: int, reward: float, masked: bool = False) -> Trajectory:
    """A one-turn trajectory over the character vocabulary (ids 6..102)."""
    prompt = tuple(rng.randrange(6, 100) for _ in range(rng.randrange(4, 9)))
    completion = tuple(rng.randrange(6, 100) for _ in range(rng.randrange(2, 6)))
    turn = Turn(prompt, completion, tuple(-4.6 for _ in completion), (1,) * len(completion), 0,
                FinishReason.STOP)
    return Trajectory("t", index, "answer", (Segment((turn,)),), Reward(reward),
                      FinishReason.STOP, masked=masked, mask_reason="infra" if masked else None)


def groups(seed: int, masked_group: bool = False) -> list[TrajectoryGroup]:
    rng = random.Random(seed)
    samples = [sample(rng, i, float(i % 2)) for i in range(4)]
    drawn = [TrajectoryGroup("t", tuple(samples))]
    if masked_group:  # rewards that would move weights, and one failed sample: dropped whole
        rest = [sample(rng, i, float(i % 2 == 0)) for i in range(3)]
        drawn.append(TrajectoryGroup("t", (*rest, sample(rng, 3, 1.0, masked=True))))
    return drawn


def weights(backend: TorchBackend) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in backend.params.items()}


def test_a_group_with_a_masked_trajectory_changes_no_weight(char_model):
    plain, with_masked = TorchBackend(char_model), TorchBackend(char_model)
    train_on(plain, CONFIG, groups(0))
    metrics = train_on(with_masked, CONFIG, groups(0, masked_group=True))
    assert metrics["masked"] == 1 and metrics["dropped_groups"] == 1
    changed = weights(plain)
    assert any(not torch.equal(changed[n], p) for n, p in weights(TorchBackend(char_model)).items())
    assert all(torch.equal(changed[n], p) for n, p in weights(with_masked).items())
    only_masked = [TrajectoryGroup("t", (sample(random.Random(1), 0, 1.0, masked=True),))]
    before = weights(plain)
    assert "grad_norm" not in train_on(plain, CONFIG, only_masked)  # no step taken
    assert all(torch.equal(before[n], p) for n, p in weights(plain).items())


def test_resume_gives_the_same_next_step(char_model, tmp_path):
    first = TorchBackend(char_model)
    train_on(first, CONFIG, groups(1))
    first.save_state(tmp_path / "ckpt", data_position=1)
    loss = train_on(first, CONFIG, groups(2))["loss"]
    draw = torch.rand(3)

    resumed = TorchBackend(char_model, seed=123)  # another seed: load_state must restore RNG
    state = resumed.load_state(tmp_path / "ckpt")
    assert (state.step, state.data_position) == (1, 1)
    assert train_on(resumed, CONFIG, groups(2))["loss"] == loss
    assert torch.equal(torch.rand(3), draw)
    after = weights(first)
    assert all(torch.equal(after[n], p) for n, p in weights(resumed).items())


def test_a_checkpoint_is_written_whole(char_model, tmp_path):
    backend = TorchBackend(char_model)
    backend.save_state(tmp_path / "ckpt")
    backend.save_state(tmp_path / "ckpt")  # overwriting goes through a staging folder too
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "optimizer.pt", "state.json", "weights.safetensors"]


def test_a_checkpoint_survives_a_power_loss(char_model, tmp_path, fsynced):
    """Stops: a checkpoint that survives a killed process but not a power loss (renamed into
    place with its data never flushed), so a resumed run loads zeros or a torn file: every file
    and both renames are fsynced, as for stored trajectories."""
    path = Checkpoints(tmp_path).save(TorchBackend(char_model), LoopState(step=1))
    names = {Path(p).name for p in fsynced}
    assert {"weights.safetensors", "optimizer.pt", "state.json"} <= names
    assert any(n.startswith(".loop.json.staging-") for n in names)  # loop.json's data
    assert {str(path), str(path.parent)} <= set(fsynced)  # the renames of loop.json and folder
    assert Checkpoints(tmp_path).latest() == path


def test_a_killed_saves_staging_is_removed_by_the_next_save(char_model, tmp_path):
    """Stops: each killed checkpoint save leaving a full-size staging folder behind (a disk
    filled by crashed saves of steps never saved again)."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    folder = RunDir(tmp_path).checkpoints
    folder.mkdir(parents=True)
    leftover = staging_path(folder / "step-000005", pid=dead.pid)
    leftover.mkdir()
    (leftover / "weights.safetensors").write_bytes(b"half")
    path = Checkpoints(tmp_path).save(TorchBackend(char_model), LoopState(step=6))
    assert sorted(p.name for p in folder.iterdir()) == [path.name]


async def served_logprobs(client: InferenceClient, prompt: list[int]) -> tuple[tuple, tuple]:
    out = await client.complete(prompt, Sampling(max_tokens=12, seed=7, ignore_eos=True))
    return out.token_ids, out.logprobs


@pytest.mark.slow
def test_lora_weights_reach_the_server_and_it_samples_with_them(char_model):
    backend = TorchBackend(char_model, lora=LoraSettings(rank=4, alpha=8))
    assert all("lora_" in name for name in backend.params)  # only adapters are trained
    train_on(backend, CONFIG, groups(3))
    update = backend.save_weights_for_sampler(version=1)
    prompt = [3, *range(40, 50), 1, 4]

    async def check() -> None:
        with embedded_server(str(char_model)) as server:
            async with InferenceClient([server.url], api_keys=[server.api_key]) as client:
                await client.update_weights(str(update.path), update.version)
                ids, logprobs = await served_logprobs(client, prompt)
        [datum] = trajectory_data(_one_turn(prompt, ids, logprobs), 1.0)
        [trainer] = backend.forward([datum])
        sampled = [lp for lp, w in zip(trainer, datum.loss_fn_inputs["weights"], strict=True)
                   if w]
        assert max(abs(a - b) for a, b in zip(sampled, logprobs, strict=True)) < 1e-3
        # The update mattered: the base weights give other logprobs for the same tokens.
        [base] = TorchBackend(char_model).forward([datum])
        assert max(abs(a - b) for a, b in zip(trainer, base, strict=True)) > 1e-3

    try:
        asyncio.run(check())
    finally:
        backend.close()
    assert not update.path.exists()  # close() removes the shared-memory file


def _one_turn(prompt: list[int], ids: tuple, logprobs: tuple) -> Trajectory:
    turn = Turn(tuple(prompt), tuple(ids), tuple(logprobs), (1,) * len(ids), 1,
                FinishReason.LENGTH)
    return Trajectory("t", 0, "answer", (Segment((turn,)),), Reward(0.0), FinishReason.STOP)


def test_micro_batches_sum_to_the_whole_batch(char_model):
    """Reductions are weights over the whole batch, so splitting it changes nothing."""
    batch = groups_to_batch(groups(4) + groups(5), "grpo").data
    for reduction in ("token-mean", "seq-mean-token-mean"):
        whole, split = TorchBackend(char_model), TorchBackend(char_model, micro_batch_tokens=16)
        config = {"reduction": reduction, "clip_low": 0.2, "clip_high": 0.2}
        one = whole.forward_backward(batch, "ppo", config).loss
        many = split.forward_backward(batch, "ppo", config).loss
        assert many == pytest.approx(one, rel=1e-5, abs=1e-7)
        for name, param in whole.params.items():
            assert param.grad is not None
            torch.testing.assert_close(split.params[name].grad, param.grad, rtol=1e-4, atol=1e-7)


def test_sft_refuses_a_run_sampled_with_another_tokenizer(char_model):
    from skyrl_agent.backends.backend import Datum
    from skyrl_agent.errors import UserError
    from skyrl_agent.rl.sft import _check_vocabulary

    _check_vocabulary([Datum((5, 102), {"target_tokens": (102, 5)})], str(char_model))
    with pytest.raises(UserError, match="token id 500 but"):
        _check_vocabulary([Datum((5, 500), {"target_tokens": (500, 5)})], str(char_model))


def test_bad_calls_are_refused_before_any_work(char_model):
    backend = TorchBackend(char_model)
    with pytest.raises(ValueError, match="unknown loss_fn 'ppo2'"):
        backend.forward_backward(groups_to_batch(groups(0), "grpo").data, "ppo2")
    with pytest.raises(ValueError, match="at least one datum"):
        backend.forward_backward([], "ppo")
