"""Shared-memory weight sync: the file is valid safetensors, the server's loader reads exactly the
trainer's weights from it, adopted parameters update it in place, and bad input changes nothing."""

from __future__ import annotations

import json
import os
import stat
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

from skyrl_agent.model.weights.files import shared_memory_dir
from skyrl_agent.model.weights.reader import load_weights
from skyrl_agent.model.weights.writer import SharedWeights

CONFIG = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)


def tiny_llama(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**CONFIG)).eval()


def parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    # named_parameters lists a tied weight once, under the embedding's name.
    return dict(model.named_parameters())


def logits(model: LlamaForCausalLM) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([[1, 5, 9, 33, 2, 60]])).logits


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "weights.safetensors"


@pytest.fixture
def trainer() -> LlamaForCausalLM:
    return tiny_llama(seed=0)


@pytest.fixture
def server() -> LlamaForCausalLM:
    return tiny_llama(seed=1)


@pytest.fixture
def shared(path: Path, trainer: LlamaForCausalLM) -> Iterator[SharedWeights]:
    with SharedWeights(path, parameters(trainer)) as weights:
        yield weights


def assert_same_state(server: torch.nn.Module, trainer: torch.nn.Module) -> None:
    ours, theirs = server.state_dict(), trainer.state_dict()
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert torch.equal(ours[name], tensor), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_file_reads_back_as_the_source_tensors(path: Path, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    # Odd sizes and a scalar, so tensors do not all land on aligned boundaries by chance.
    source = {"a": torch.randn(3, 5), "b.weight": torch.randn(7), "c": torch.randn(()),
              "d": torch.randn(16, 4), "empty": torch.randn(0, 3)}
    source = {name: tensor.to(dtype) for name, tensor in source.items()}
    with SharedWeights(path, source) as shared:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert shared.nbytes == sum(tensor.nbytes for tensor in source.values())
        loaded = load_file(path)
        assert loaded.keys() == source.keys()
        for name, tensor in source.items():
            assert loaded[name].dtype == dtype and torch.equal(loaded[name], tensor), name
        with safe_open(path, framework="pt") as handle:
            assert sorted(handle.keys()) == sorted(source)
            assert torch.equal(handle.get_tensor("d"), source["d"])


def test_data_region_starts_aligned(path: Path) -> None:
    source = {"x": torch.ones(3, dtype=torch.float16), "y": torch.ones(4, 16),
              "z": torch.ones(5, dtype=torch.bfloat16), "w": torch.ones(3)}
    with SharedWeights(path, source):
        raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    assert (8 + length) % 64 == 0
    header = json.loads(raw[8 : 8 + length])
    for info in header.values():
        itemsize = {"F32": 4, "F16": 2, "BF16": 2}[info["dtype"]]
        assert info["data_offsets"][0] % itemsize == 0, info
    assert header["y"]["data_offsets"][0] % 64 == 0  # 256 bytes: laid out first, aligned


def test_server_loads_the_trainers_weights(shared: SharedWeights, trainer: LlamaForCausalLM,
                                           server: LlamaForCausalLM) -> None:
    assert not torch.equal(logits(server), logits(trainer))
    assert "lm_head.weight" not in shared.views  # tied: travels as the embedding
    load_weights(server, shared.path)
    assert_same_state(server, trainer)
    assert torch.equal(server.lm_head.weight, trainer.model.embed_tokens.weight)
    assert torch.equal(logits(server), logits(trainer))


def test_write_copies_new_values_into_the_file(shared: SharedWeights, trainer: LlamaForCausalLM,
                                              server: LlamaForCausalLM) -> None:
    with torch.no_grad():
        for param in trainer.parameters():
            param.mul_(-0.5)
    assert shared.write(parameters(trainer)) == shared.nbytes
    load_weights(server, shared.path)
    assert torch.equal(logits(server), logits(trainer))


def test_adopted_parameters_update_the_file_in_place(
        shared: SharedWeights, trainer: LlamaForCausalLM, server: LlamaForCausalLM) -> None:
    params = parameters(trainer)
    before = logits(trainer)
    shared.adopt(params)
    assert torch.equal(logits(trainer), before)
    for name, param in params.items():
        assert param.data_ptr() == shared.views[name].data_ptr(), name
    optimizer = torch.optim.AdamW(trainer.parameters(), lr=0.05)
    trainer.train()
    loss = trainer(torch.tensor([[3, 4, 5, 6]]), labels=torch.tensor([[3, 4, 5, 6]])).loss
    loss.backward()
    optimizer.step()
    trainer.eval()
    stepped = logits(trainer)
    assert not torch.equal(stepped, before)
    # No write(): the step itself changed the file.
    on_file = load_file(shared.path)
    for name, param in params.items():
        assert torch.equal(on_file[name], param.detach()), name
    load_weights(server, shared.path)
    assert torch.equal(logits(server), stepped)
    assert_same_state(server, trainer)
    assert shared.write(params) == 0


def test_adopt_refuses_a_wrong_dtype_and_changes_nothing(shared: SharedWeights,
                                                         trainer: LlamaForCausalLM) -> None:
    params = parameters(trainer)
    norm = "model.norm.weight"
    wrong = {norm: params[norm], "model.embed_tokens.weight":
             torch.nn.Parameter(params["model.embed_tokens.weight"].detach().double())}
    before = shared.path.read_bytes()
    with pytest.raises(ValueError, match="dtype"):
        shared.adopt(wrong)
    assert params[norm].data_ptr() != shared.views[norm].data_ptr()
    assert shared.path.read_bytes() == before


def test_close_gives_adopted_parameters_their_own_memory(
        path: Path, trainer: LlamaForCausalLM) -> None:
    before = logits(trainer)
    with SharedWeights(path, parameters(trainer)) as shared:
        shared.adopt(parameters(trainer))
        mapped = {name: view.data_ptr() for name, view in shared.views.items()}
    assert not path.exists()
    # Off the mapping (so it can be unmapped and its memory freed), values kept.
    for name, param in parameters(trainer).items():
        assert param.data_ptr() != mapped[name], name
    assert torch.equal(logits(trainer), before)


@pytest.mark.parametrize("bad", ["unknown name", "wrong shape"])
def test_bad_write_changes_nothing(shared: SharedWeights, trainer: LlamaForCausalLM,
                                   bad: str) -> None:
    before = shared.path.read_bytes()
    # A valid tensor first, so a check made only on the way would already have written it.
    update = {"model.norm.weight": torch.full((32,), 7.0)}
    if bad == "unknown name":
        update["model.not_there.weight"] = torch.zeros(3)
    else:
        update["model.layers.0.mlp.up_proj.weight"] = torch.zeros(32, 64)
    with pytest.raises(ValueError, match=r"not in the shared|does not match"):
        shared.write(update)
    assert shared.path.read_bytes() == before


def test_unsupported_dtype_is_refused_before_creating_the_file(path: Path) -> None:
    with pytest.raises(ValueError, match="not supported"):
        SharedWeights(path, {"ids": torch.arange(4)})
    assert not path.exists()


def test_an_existing_path_is_refused(path: Path) -> None:
    path.write_bytes(b"someone else's")
    with pytest.raises(FileExistsError, match="refusing"):
        SharedWeights(path, {"w": torch.ones(2)})
    assert path.read_bytes() == b"someone else's"


def test_a_planted_symlink_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    link = tmp_path / "weights.safetensors"
    link.symlink_to(target)  # dangling: O_CREAT alone would create the target through it
    with pytest.raises(FileExistsError, match="refusing"):
        SharedWeights(link, {"w": torch.ones(2)})
    assert not target.exists() and link.is_symlink()


def test_close_removes_the_file_and_is_idempotent(path: Path) -> None:
    shared = SharedWeights(path, {"w": torch.ones(2)})
    assert path.exists()
    shared.close()
    assert not path.exists()
    shared.close()
    with pytest.raises(ValueError, match="closed"):
        shared.write({"w": torch.zeros(2)})


def test_close_with_a_view_still_held_keeps_it_valid(path: Path) -> None:
    shared = SharedWeights(path, {"w": torch.arange(4.0)})
    kept = shared.views["w"]
    shared.close()
    assert not path.exists()
    assert kept.tolist() == [0.0, 1.0, 2.0, 3.0]  # still mapped, not freed under it


def test_shared_memory_dir_is_a_writable_directory() -> None:
    directory = shared_memory_dir()
    assert directory.is_dir() and os.access(directory, os.W_OK)


def test_files_of_dead_trainers_are_removed_and_live_ones_kept(tmp_path):
    import subprocess

    from skyrl_agent.model.weights.files import (
        ADAPTERS_PREFIX,
        PREFIX,
        new_adapters_dir,
        new_weights_path,
        remove_orphans,
    )

    finished = subprocess.Popen(["true"])
    finished.wait()
    orphan = tmp_path / f"{PREFIX}{finished.pid}-0.safetensors"
    mine = new_weights_path(tmp_path)
    unrelated = tmp_path / f"{PREFIX}notapid.safetensors"
    for path in (orphan, mine, unrelated):
        path.write_bytes(b"x")
    orphan_adapters = tmp_path / f"{ADAPTERS_PREFIX}{finished.pid}-abc"
    (orphan_adapters / "version-1").mkdir(parents=True)
    my_adapters = new_adapters_dir(tmp_path)
    assert remove_orphans(tmp_path) == 2
    assert not orphan.exists() and mine.exists() and unrelated.exists()
    assert not orphan_adapters.exists() and my_adapters.is_dir()
    assert new_weights_path(tmp_path) != mine
