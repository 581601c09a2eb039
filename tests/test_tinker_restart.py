"""Kill the Tinker server mid-run and start it again on the same data dir and port: saved
checkpoints load, sampling sessions continue, and the SDK's own retries carry a client through
the outage. Plus the pieces under it: seq_id order and tinker:// paths."""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import numpy as np
import pytest

from skyrl_agent.tinker.errors import TinkerUserError
from skyrl_agent.tinker.ordering import SeqOrder
from skyrl_agent.tinker.store import ModelSpec, Store
from tests.test_tinker import datum, logprobs_of
from tests.tinker_server import _sdk_env, free_port, spawn, wait_healthy  # noqa: F401
from tests.tiny_models import char_model_dir

tinker = pytest.importorskip("tinker")
types = tinker.types


@pytest.mark.slow
def test_checkpoints_and_sampling_sessions_survive_a_kill_and_the_sdk_rides_the_outage(
        tmp_path):
    model = f"tiny={char_model_dir(tmp_path / 'char', hidden=32, layers=1)}"
    port, data = free_port(), tmp_path / "data"
    first = spawn([model], data, port, tmp_path / "first.log")
    try:
        wait_healthy(port)
        service = tinker.ServiceClient(base_url=f"http://127.0.0.1:{port}", api_key="tml-t")
        client = service.create_lora_training_client(base_model="tiny", rank=4).result()
        seq = client.get_tokenizer().encode("survive a restart")
        for _ in range(2):
            client.forward_backward([datum(seq, weights=[1] * (len(seq) - 1))], "cross_entropy")
            client.optim_step(types.AdamParams(learning_rate=5e-2))
        state = client.save_state("before-kill").result().path
        sampler = client.save_weights_and_get_sampling_client().result()
        trained = logprobs_of(client, [seq])[0]
        params = types.SamplingParams(max_tokens=6, seed=3)
        prompt = types.ModelInput.from_ints(seq[:5])
        sampled = sampler.sample(prompt, 1, params).result().sequences[0]
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()

    # Down for ~3 s while the client asks; the SDK retries connection errors with backoff.
    holder: dict[str, object] = {}

    def restart() -> None:
        time.sleep(3)
        holder["second"] = spawn([model], data, port, tmp_path / "second.log")

    restarter = threading.Thread(target=restart)
    restarter.start()
    try:
        started = time.monotonic()
        again = sampler.sample(prompt, 1, params).result().sequences[0]
        assert time.monotonic() - started > 2.5  # it really waited out the outage
        assert again.tokens == sampled.tokens  # the same ephemeral weights, the same seed
        np.testing.assert_allclose(again.logprobs, sampled.logprobs, atol=1e-5)

        restored = service.create_training_client_from_state_with_optimizer(state).result()
        np.testing.assert_allclose(logprobs_of(restored, [seq])[0], trained, atol=1e-6)
        with pytest.raises(tinker.RequestFailedError, match="restarted"):
            client.forward_backward([datum(seq, weights=[1] * (len(seq) - 1))],
                                    "cross_entropy").result()
    finally:
        restarter.join()
        second = holder.get("second")
        if second is not None:
            second.send_signal(signal.SIGTERM)  # type: ignore[attr-defined]
            second.wait(timeout=30)  # type: ignore[attr-defined]


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


async def test_retrieve_future_long_polls_then_says_try_again_and_410_for_unknown_ids(
        tmp_path):
    """The future protocol over real HTTP: a pending request is held for poll_s and answered
    try_again, a finished one returns its payload (again on a second poll), an error carries
    its category, and an id this server never issued answers 410 (the SDK then resends)."""
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

    runner = web.AppRunner(TinkerApp(service).app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/api/v1/retrieve_future"
    try:
        pending, failed = service.futures.submit("OptimStep", slow()), \
            service.futures.submit("OptimStep", failing())
        async with aiohttp.ClientSession() as http:
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
            async with http.post(url, json={"nonsense": 1}) as reply:
                assert reply.status == 400 and "request_id" in (await reply.json())["detail"]
    finally:
        await runner.cleanup()
