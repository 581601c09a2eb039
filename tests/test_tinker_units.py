"""The Tinker server's pieces: seq_id order, tinker:// paths, which weight files a sampler loads,
and the future / long-poll protocol over real HTTP."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from skyrl_agent.tinker.errors import TinkerUserError
from skyrl_agent.tinker.ordering import SeqOrder
from skyrl_agent.tinker.sampling import PARTIAL, LoadedWeights
from skyrl_agent.tinker.store import ModelSpec, SamplerRef, Store
from tests.tiny_models import char_model_dir


def test_a_sampler_reloads_the_base_only_when_the_next_file_leaves_changes_behind(tmp_path):
    def file(name: str, *keys: str) -> Path:
        save_file({k: torch.zeros(1) for k in keys}, tmp_path / name)
        return tmp_path / name

    base = [file("base.safetensors", "a", "b", "c")]
    lora, other_lora, full = file("l1", "a", "b"), file("l2", "a", "b"), file("f", "a", "b", "c")
    state = LoadedWeights()
    files, state = state.plan(lora, base)
    assert files == [lora] and state.dirty == {"a", "b"}
    files, state = state.plan(other_lora, base)
    assert files == [other_lora]  # covers every changed name: no base reload needed
    files, state = state.plan(full, base)
    assert files == [full] and state.dirty == {"a", "b", "c"}
    files, state = state.plan(lora, base)
    assert files == [*base, lora]  # c would keep the full file's value otherwise
    files, state = state.plan(None, base)
    assert files == base and state.key is None and not state.dirty
    assert state.plan(None, base)[0] == []
    broken = state.interrupted(LoadedWeights(str(full), frozenset({"a", "b", "c"})))
    assert broken.key == PARTIAL and broken.plan(lora, base)[0] == [*base, lora]


async def test_seq_order_runs_requests_in_seq_id_order_whatever_the_arrival():
    order = SeqOrder(next_seq=1, gap_timeout_s=5)
    ran: list[int] = []

    async def job(n: int) -> int:
        ran.append(n)
        await asyncio.sleep(0)
        return n

    # Chunks of one forward_backward arrive first chunk last; then the optimizer step.
    results = await asyncio.gather(*(order.run(n, lambda n=n: job(n)) for n in (3, 2, 4, 1)))
    assert ran == [1, 2, 3, 4] and results == [3, 2, 4, 1]
    assert await order.run(None, lambda: job(0)) == 0  # unnumbered: runs in arrival order


async def test_seq_order_moves_past_a_seq_id_that_never_comes():
    order = SeqOrder(next_seq=1, gap_timeout_s=0.2)
    started = time.monotonic()
    assert await order.run(2, lambda: asyncio.sleep(0, result="late")) == "late"
    assert time.monotonic() - started >= 0.2
    assert order.next_seq == 3


def test_store_accepts_only_its_own_tinker_paths(tmp_path):
    store = Store(tmp_path)
    folder, path = store.new_checkpoint("s:train:0", "weights", "step-1")
    assert path == "tinker://s:train:0/weights/step-1" and folder.is_relative_to(tmp_path)
    with pytest.raises(TinkerUserError, match="no checkpoint"):
        store.resolve(path, "weights")  # nothing saved there yet
    folder.mkdir(parents=True)
    (folder / "spec.json").write_text(ModelSpec(base_model="tiny", lora_rank=4).model_dump_json())
    assert store.resolve(path, "weights").spec.lora_rank == 4
    with pytest.raises(TinkerUserError, match="is not sampler weights"):
        store.resolve(path, "sampler_weights")
    for bad in ("tinker://../weights/x", "tinker://s:train:0/weights/..", "file:///etc/passwd",
                "tinker://s/weights/a/b", "tinker://s/other/x", "tinker://.hidden/weights/x"):
        with pytest.raises(TinkerUserError):
            store.resolve(bad, "weights")
    with pytest.raises(TinkerUserError, match="invalid checkpoint name"):
        store.new_checkpoint("s:train:0", "weights", "../escape")
    with pytest.raises(TinkerUserError, match="already exists"):
        store.new_checkpoint("s:train:0", "weights", "step-1", overwrite=False)


def test_store_names_with_a_trailing_newline_are_refused(tmp_path):
    """Stops names that pass a `^...$` pattern with a newline at the end (`$` matches before
    it), which would make files and tinker:// paths whose names end in a line break."""
    store = Store(tmp_path)
    with pytest.raises(TinkerUserError, match="invalid checkpoint name"):
        store.new_checkpoint("s:train:0", "weights", "step-1\n")
    with pytest.raises(TinkerUserError, match="invalid training run id"):
        store.new_checkpoint("s:train:0\n", "weights", "step-1")
    with pytest.raises(TinkerUserError, match="invalid sampling session id"):
        store.save_session("sess\n", SamplerRef(base_model="tiny"))
    assert store.load_session("sess\n") is None


async def test_retrieve_future_long_polls_then_says_try_again_and_410_for_unknown_ids(
        tmp_path):
    """The future protocol over real HTTP: a pending request is held for poll_s and answered
    try_again, a finished one returns its payload (again on a second poll), an error carries
    its category, and an id this server never issued answers 410 (the SDK then resends), as
    does another tenant's (ids are counters: a guessed one must not read someone's result)."""
    import aiohttp
    from aiohttp import web

    from skyrl_agent.tinker.app import TinkerApp
    from skyrl_agent.tinker.config import ServiceOptions
    from skyrl_agent.tinker.futures import Result
    from skyrl_agent.tinker.service import TinkerService

    folder = char_model_dir(tmp_path / "char", hidden=16, layers=1)
    service = TinkerService(ServiceOptions(data_dir=tmp_path / "data",
                                           models=(f"tiny={folder}",), poll_s=0.3))
    release = asyncio.Event()

    async def slow() -> Result:
        await release.wait()
        return Result(json={"metrics": {"step": 1.0}})

    async def failing() -> Result:
        raise TinkerUserError("bad datum")

    runner = web.AppRunner(TinkerApp(service, {"default": "tml-unit",
                                                "other": "tml-other"}).app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/api/v1/retrieve_future"
    try:
        pending, failed = service.futures.submit("OptimStep", slow(), "default"), \
            service.futures.submit("OptimStep", failing(), "default")
        async with aiohttp.ClientSession(headers={"X-API-Key": "tml-unit"}) as http:
            started = time.monotonic()
            async with http.post(url, json={"request_id": pending}) as reply:
                assert await reply.json() == {"type": "try_again", "request_id": pending,
                                              "queue_state": "active"}
            assert time.monotonic() - started >= 0.3
            release.set()
            for _ in range(2):
                async with http.post(url, json={"request_id": pending}) as reply:
                    assert await reply.json() == {"metrics": {"step": 1.0}}
            async with http.post(url, json={"request_id": failed}) as reply:
                assert await reply.json() == {"error": "bad datum", "category": "user"}
            async with http.post(url, json={"request_id": "never-issued"}) as reply:
                assert reply.status == 410
            async with http.post(url, json={"request_id": pending},
                                 headers={"X-API-Key": "tml-other"}) as reply:
                assert reply.status == 410
            async with http.post(url, json={"nonsense": 1}) as reply:
                assert reply.status == 400 and "request_id" in (await reply.json())["detail"]
    finally:
        await runner.cleanup()


def test_the_server_logs_its_own_info_and_only_warnings_of_libraries():
    """Stops: the Tinker server's logging at INFO for every library, which printed pages of
    TorchDynamo compile metrics (at exit too) into the test output and the terminal."""
    import subprocess
    import sys

    script = ("import logging\n"
              "from skyrl_agent.tinker.server import server_logging\n"
              "server_logging()\n"
              "logging.getLogger('torch._dynamo.utils').info('dynamo compile metrics')\n"
              "logging.getLogger('aiohttp.access').info('GET /api/v1/healthz')\n"
              "logging.getLogger('torch._dynamo.utils').warning('a library warning')\n"
              "logging.getLogger('skyrl_agent.tinker.service').info('session created')\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=60, check=True)
    assert "session created" in result.stderr and "a library warning" in result.stderr
    assert "dynamo compile metrics" not in result.stderr and "healthz" not in result.stderr


def test_lora_models_over_one_base_hold_its_weights_once(tmp_path):
    """Stops: each tenant's LoRA model holding a copy of the base (memory = base x models),
    and a shared base that one model's training can move under another."""
    from skyrl_agent.backends.backend import AdamParams, Datum
    from skyrl_agent.tinker.config import BaseModels, ServiceOptions
    from skyrl_agent.tinker.models import lora_spec, make_backend

    folder = char_model_dir(tmp_path / "char", hidden=16, layers=1)
    base = BaseModels([f"tiny={folder}"]).get("tiny")
    options = ServiceOptions(data_dir=tmp_path / "data", models=(f"tiny={folder}",))
    frozen: dict[str, object] = {}
    first, second = (make_backend(base, lora_spec(base, rank, True, True, False), 1, options,
                                  frozen) for rank in (4, 8))
    pointers = [{name: p.data_ptr() for name, p in model.model.named_parameters()
                 if "lora_" not in name} for model in (first, second)]
    assert pointers[0] == pointers[1] and len(frozen) == 1  # every base tensor, once
    base_before = {n: p.detach().clone() for n, p in second.model.named_parameters()
                   if "lora_" not in n}
    datum = Datum((3, 4, 5, 6), {"target_tokens": (4, 5, 6, 7), "weights": (1.0,) * 4})
    untouched = second.forward([datum])
    for _ in range(3):
        first.forward_backward([datum], "cross_entropy")
        first.optim_step(AdamParams(learning_rate=5e-2))
    assert first.forward([datum]) != untouched  # it trained...
    assert second.forward([datum]) == untouched  # ...and the other model did not move
    for name, param in second.model.named_parameters():
        if "lora_" not in name:
            assert torch.equal(param, base_before[name]), name


def _forward_request(target: np.ndarray) -> bytes:
    from skyrl_agent.tinker.proto import public_pb

    pb = public_pb()
    dtype = {np.dtype(np.int64): pb.DTYPE_INT64, np.dtype(np.float32): pb.DTYPE_FLOAT32}
    datum = pb.Datum(model_input=[pb.Chunk(encoded_text=pb.EncodedTextChunk(
        tokens=np.arange(1, len(target) + 1, dtype=np.int32).tobytes()))])
    datum.loss_fn_inputs["target_tokens"].CopyFrom(pb.Tensor(
        dense=target.tobytes(), dtype=dtype[target.dtype], shape=[len(target)]))
    request = pb.ForwardBackwardRequest(model_id="m", loss_fn="cross_entropy", data=[datum])
    return bytes(request.SerializeToString())


def test_tinker_target_tokens_arrive_as_exact_integers_and_floats_are_refused():
    """Stops: token ids taken from the wire as floats (above 2**24 a float32 changes them),
    and a client's float target_tokens silently rounded instead of refused in one line."""
    from skyrl_agent.tinker.proto import decode_forward_backward

    big = 2**24 + 1
    [datum] = decode_forward_backward(_forward_request(np.array([7, big], np.int64))).data
    assert datum.loss_fn_inputs["target_tokens"] == (7, big)
    assert all(type(t) is int for t in datum.loss_fn_inputs["target_tokens"])
    with pytest.raises(TinkerUserError, match=r"^datum 0: target_tokens: must be an integer "
                                              r"tensor \(int64 or int32\), not float32$"):
        decode_forward_backward(_forward_request(np.array([7.0, 8.0], np.float32)))
