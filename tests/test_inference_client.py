"""The TITO client: sticky routing over real servers, retries, fan-out of control calls."""

from __future__ import annotations

import asyncio
import base64
import io
import socket
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web

from skyrl_agent.errors import UserError
from skyrl_agent.inference import client as client_module
from skyrl_agent.inference.client import InferenceClient, InferenceError, Sampling
from skyrl_agent.inference.process import embedded_server
from skyrl_agent.inference.vllm import routes
from skyrl_agent.inference.vllm.launch import (
    WORKER_DIR,
    VLLMOptions,
    vllm_command,
    vllm_environment,
    vllm_server,
)
from skyrl_agent.types import RoutedExperts


@pytest.fixture(scope="module")
def two_processes(tiny_model_dir):
    first = embedded_server(str(tiny_model_dir), served_model_name="tiny")
    second = embedded_server(str(tiny_model_dir), served_model_name="tiny")
    first.start()
    try:
        second.start()
        yield [first, second]
    finally:
        first.stop()
        second.stop()


@pytest.fixture(scope="module")
def two_servers(two_processes):
    return [process.url for process in two_processes]


async def test_sessions_stick_to_one_server_and_spread(two_servers):
    async with InferenceClient(two_servers, model="tiny") as client:
        sampling = Sampling(max_tokens=4, temperature=1.0)
        first = await asyncio.gather(*[client.complete([1, 2, 3], sampling, session_id=f"s{i}")
                                       for i in range(4)])
        again = await asyncio.gather(*[client.complete([1, 2, 3], sampling, session_id=f"s{i}")
                                       for i in range(4)])
        assert [c.server for c in first] == [c.server for c in again]
        assert {c.server for c in first} == set(two_servers)
        assert all(len(c.token_ids) == len(c.logprobs) == 4 for c in first + again)
        client.end_session("s0")
        assert "s0" not in client._routes


async def test_busy_time_counts_only_while_some_generation_is_in_flight(two_servers):
    async with InferenceClient(two_servers, model="tiny") as client:
        assert await client.busy_seconds() == 0.0
        await asyncio.sleep(0.3)  # idle time is not busy time
        assert await client.busy_seconds() == 0.0
        sampling = Sampling(max_tokens=16, ignore_eos=True)
        started = time.monotonic()
        await asyncio.gather(*[client.complete([1, 2, 3], sampling, session_id=f"b{i}")
                               for i in range(3)])
        spanned = time.monotonic() - started
        busy = await client.busy_seconds()
        assert 0 < busy <= spanned  # overlapping calls count once
        await asyncio.sleep(0.3)
        assert await client.busy_seconds() == busy


async def test_control_calls_reach_every_server(two_processes, two_servers):
    keys = [process.api_key for process in two_processes]  # each server has its own
    async with InferenceClient(two_servers, model="tiny", api_keys=keys) as client:
        await client.pause("keep")
        replies = await client._fan_out("GET", "/is_paused")
        assert [r["is_paused"] for r in replies] == [True, True]
        await client.resume()
        assert not await client.is_paused()
        with pytest.raises(InferenceError, match="refusing"):
            await client.update_weights("/nonexistent.safetensors", 3)
        assert await client.health()


async def test_client_errors_are_not_retried(two_servers):
    async with InferenceClient(two_servers[:1], model="other-model") as client:
        with pytest.raises(InferenceError) as info:
            await client.complete([1, 2], Sampling(max_tokens=2))
    assert info.value.status == 404 and "does not exist" in info.value.message


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


SEEN = web.AppKey("seen", list)


def _scripted_app(replies: list[int], hold: asyncio.Event | None = None) -> web.Application:
    """A unit-tier stand-in server: answers the listed statuses in turn, then a completion.
    With `hold`, a request for the prompt [99] is answered only once `hold` is set."""
    seen: list[int] = []

    async def completions(request: web.Request) -> web.Response:
        seen.append(1)
        if hold is not None and (await request.json())["prompt"] == [99]:
            await hold.wait()
        if replies:
            return web.json_response({"error": {"message": "busy"}}, status=replies.pop(0))
        choice = {"token_ids": [7], "logprobs": {"token_logprobs": [-0.5]}, "text": "x",
                  "finish_reason": "stop", "policy_version": 4}
        return web.json_response({"choices": [choice]})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app[SEEN] = seen
    return app


async def _serve(app: web.Application, port: int) -> web.AppRunner:
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


async def test_retries_503_then_succeeds():
    port = _free_port()
    app = _scripted_app([503, 503])
    runner = await _serve(app, port)
    try:
        async with InferenceClient([f"http://127.0.0.1:{port}"]) as client:
            out = await client.complete([1], Sampling(max_tokens=1))
    finally:
        await runner.cleanup()
    assert len(app[SEEN]) == 3 and out.token_ids == (7,) and out.policy_version == 4


@pytest.mark.parametrize("remembered", [4096, 1])
async def test_a_sessions_prompts_reach_the_server_exactly_however_they_follow_each_other(
        remembered, monkeypatch):
    """A session's prompt ids are JSON-encoded a turn at a time (only ids after the last
    prompt are encoded anew). The server must parse exactly the prompt given, whether it
    extends the last one, differs inside it, is shorter, or belongs to another session; and
    with room for one session's prompt, the other's is forgotten, not mixed in."""
    monkeypatch.setattr(client_module, "REMEMBERED_PROMPTS", remembered)
    bodies: list[dict] = []

    async def completions(request: web.Request) -> web.Response:
        bodies.append(await request.json())
        choice = {"token_ids": [7], "logprobs": {"token_logprobs": [-0.5]}, "text": "x",
                  "finish_reason": "stop", "policy_version": 0}
        return web.json_response({"choices": [choice]})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    port = _free_port()
    runner = await _serve(app, port)
    first = [5, 6, 7, 8, 9]
    sent = [("a", first), ("a", [*first, 7, 10]),  # extends the last prompt
            ("a", [5, 6, 70, 8, 9, 7, 10, 11]),  # longer, but differs inside it
            ("b", [5, 6, 70]),  # another session: its own history
            ("a", [5, 6]), ("a", [5, 6]),  # shorter; then the same again
            (None, [1, 2, 3])]
    try:
        async with InferenceClient([f"http://127.0.0.1:{port}"]) as client:
            for session, prompt in sent:
                await client.complete(prompt, Sampling(max_tokens=3, seed=4, stop=("z",)),
                                      session_id=session)
            assert len(client._prompts) <= remembered
            client.end_session("a")
            await client.complete([5, 6, 7], Sampling(max_tokens=3), session_id="a")
    finally:
        await runner.cleanup()
    assert [body["prompt"] for body in bodies] == [p for _, p in sent] + [[5, 6, 7]]
    assert bodies[0]["max_tokens"] == 3 and bodies[0]["seed"] == 4
    assert bodies[0]["stop"] == ["z"]


@pytest.mark.serial  # a port reserved now is bound later
async def test_retries_until_a_server_comes_up():
    port = _free_port()
    async with InferenceClient([f"http://127.0.0.1:{port}"]) as client:
        request = asyncio.create_task(client.complete([1], Sampling(max_tokens=1)))
        await asyncio.sleep(0.5)  # connection refused meanwhile
        runner = await _serve(_scripted_app([]), port)
        try:
            out = await asyncio.wait_for(request, timeout=30)
        finally:
            await runner.cleanup()
    assert out.token_ids == (7,)


async def test_gives_up_after_the_retry_deadline():
    port = _free_port()
    async with InferenceClient([f"http://127.0.0.1:{port}"], retry_deadline_s=0.5) as client:
        with pytest.raises(InferenceError, match="no answer after retrying") as info:
            await client.complete([1], Sampling(max_tokens=1))
    assert info.value.status == 0


@pytest.mark.serial  # a time bound
async def test_a_client_error_fails_at_once_without_a_retry():
    """Stops: a 4xx being retried like a 503. The request is wrong, so asking again cannot
    help: the first answer is final (one request seen, in less than the retries' backoff)."""
    port = _free_port()
    # Retried, the 4th request (after 0.1 + 0.2 s of backoff) would get a completion.
    app = _scripted_app([400, 400, 400])
    runner = await _serve(app, port)
    try:
        async with InferenceClient([f"http://127.0.0.1:{port}"]) as client:
            started = time.monotonic()
            with pytest.raises(InferenceError) as info:
                await client.complete([1], Sampling(max_tokens=1))
            elapsed = time.monotonic() - started
    finally:
        await runner.cleanup()
    assert info.value.status == 400 and info.value.message == "busy"
    assert len(app[SEEN]) == 1 and elapsed < 0.3


@pytest.mark.serial  # ports reserved now are bound later
async def test_a_session_sticks_to_its_server_while_the_other_is_less_busy():
    """Stops: sticky routing being dropped (every request to the least busy server). Session
    s's first request is still running on its server, so the other one is less busy; s's next
    request must go to s's server all the same, and only a new session goes to the idle one."""
    release = asyncio.Event()
    apps = [_scripted_app([], hold=release), _scripted_app([], hold=release)]
    ports = [_free_port(), _free_port()]
    runners = [await _serve(app, port) for app, port in zip(apps, ports, strict=True)]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        async with InferenceClient(urls) as client:
            held = asyncio.create_task(client.complete([99], Sampling(max_tokens=1),
                                                       session_id="s"))
            while sum(len(app[SEEN]) for app in apps) == 0:
                await asyncio.sleep(0.01)
            home = urls[0] if apps[0][SEEN] else urls[1]
            again = await client.complete([1], Sampling(max_tokens=1), session_id="s")
            other = await client.complete([1], Sampling(max_tokens=1), session_id="t")
            release.set()
            first = await held
    finally:
        for runner in runners:
            await runner.cleanup()
    assert first.server == again.server == home
    assert other.server != home


def test_vllm_command_fits_the_device():
    """One launcher: on CPU the KV cache in GiB, eager mode, chunked prefill off; on a GPU
    memory utilization. Both: our file transfer backend, a Unix socket, the routes with
    per-token versions, no key on the command line."""
    options = VLLMOptions(model="/models/m", served_model_name="policy", max_model_len=4096,
                          kv_cache_mb=1500)
    socket = Path("/run/x/vllm.sock")
    cpu = vllm_command("/venv/bin/python", options, socket, "cpu")
    gpu = vllm_command("python", options, socket, "cuda")
    for argv in (cpu, gpu):
        assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
        assert argv[argv.index("--uds") + 1] == str(socket) and "--port" not in argv
        assert "--enable-scale-out" in argv and "--api-key" not in argv
        assert argv[argv.index("--served-model-name") + 1] == "policy"
        assert '"skyrl_file"' in argv[argv.index("--weight-transfer-config") + 1]
    assert {"--enforce-eager", "--no-enable-chunked-prefill"} <= set(cpu)
    assert "--gpu-memory-utilization" not in cpu and "--enforce-eager" not in gpu
    for device in ("cpu", "cuda"):
        env = vllm_environment(options, "KEY", device)
        assert env["VLLM_API_KEY"] == "KEY" and env["PYTHONPATH"] == str(WORKER_DIR)
        assert ("VLLM_CPU_KVCACHE_SPACE" in env) == (device == "cpu")
    assert vllm_environment(options, "KEY", "cpu")["VLLM_CPU_KVCACHE_SPACE"] == "2"


def _control_app(card: dict) -> web.Application:
    """A unit-tier stand-in for a server's control routes: records each route it is called on."""
    seen: list[str] = []

    async def record(request: web.Request) -> web.Response:
        seen.append(request.path)
        if request.path == "/v1/models":
            return web.json_response({"data": [card]})
        return web.json_response({"seconds": 0.0})

    app = web.Application()
    app.router.add_get("/v1/models", record)
    for route in ("/pause", "/resume", "/update_weights"):
        app.router.add_post(route, record)
    app[SEEN] = seen
    return app


async def test_only_a_server_that_cannot_swap_live_is_paused_around_its_update():
    """Stops: the trainer pausing every server for the whole transfer (the sampler idle while
    a server that stages weights beside decoding could have kept going), and the converse: a
    server without live swaps (vLLM) loading weights while it decodes."""
    live, plain = _control_app({"id": "m", "weight_swap": "live"}), _control_app({"id": "m"})
    ports = [_free_port(), _free_port()]
    runners = [await _serve(app, port) for app, port in zip((live, plain), ports, strict=True)]
    try:
        async with InferenceClient([f"http://127.0.0.1:{p}" for p in ports]) as client:
            for version in (1, 2):
                await client.update_weights("/dev/shm/policy.safetensors", version)
    finally:
        for runner in runners:
            await runner.cleanup()
    assert live[SEEN] == ["/v1/models", "/update_weights", "/update_weights"]
    assert plain[SEEN] == ["/v1/models", "/pause", "/update_weights", "/resume",
                           "/pause", "/update_weights", "/resume"]


def _vllm_npy(experts_TLK: np.ndarray) -> str:
    """Routing as vLLM's generate route sends it: base64 of the array's `.npy` bytes."""
    with io.BytesIO() as buffer:
        np.save(buffer, experts_TLK, allow_pickle=False)
        return base64.b64encode(buffer.getvalue()).decode("ascii")


def _generate_choice(completion: int, routing: np.ndarray | None,
                     finish: str = "length") -> dict:
    return {"index": 0, "token_ids": list(range(40, 40 + completion)), "text": "x",
            "finish_reason": finish,
            "logprobs": {"content": [{"logprob": -1.0}] * completion},
            "routed_experts": None if routing is None else _vllm_npy(routing)}


@pytest.mark.parametrize("experts, dtype", [(8, np.uint8), (300, np.uint16)])
def test_vllms_routing_becomes_the_clients_row_for_row(experts, dtype):
    """vLLM's `routed_experts` (a .npy of [prompt + completion - 1, layers, top_k]) becomes the
    client's RoutedExperts from position 0, each position's row unchanged, at 1- or 2-byte
    ids. Stops: a shifted start, transposed axes, ids cut to a byte."""
    prompt, completion, layers, top_k = 5, 4, 3, 2
    rng = np.random.default_rng(0)
    routing = rng.integers(0, experts, (prompt + completion - 1, layers, top_k)).astype(dtype)
    routing[:, 0, 0] = np.arange(len(routing)) % experts  # each row names its own position
    choice = routes.completion_choice(_generate_choice(completion, routing), 0,
                                      prompt_tokens=prompt, routing_asked=True)
    routed = RoutedExperts.from_json(choice["routed_experts"])
    assert (routed.start, routed.end, routed.layers, routed.top_k) == (0, 8, layers, top_k)
    assert routed.width == (1 if experts <= 256 else 2)
    assert np.array_equal(routed.array(), routing)
    assert np.array_equal(routed.since(prompt).array(), routing[prompt:])


@pytest.mark.parametrize("rows, shape", [(7, None), (9, None), (8, (8, 6))])
def test_misaligned_vllm_routing_is_refused(rows, shape):
    """Routing for one position too few or too many (a shifted prompt start, a routed last
    token) or without its layer axis would replay a neighbour's experts: refused."""
    routing = np.zeros(shape or (rows, 3, 2), dtype=np.uint8)
    with pytest.raises(ValueError, match="positions"):
        routes.completion_choice(_generate_choice(4, routing), 0, prompt_tokens=5,
                                 routing_asked=True)


def test_vllm_routing_missing_or_aborted():
    """A finished answer without routing, when the client asked, says how to start vLLM; an
    aborted one's routing is dropped (its continuation's covers it); not asked, none."""
    with pytest.raises(ValueError, match="--enable-return-routed-experts"):
        routes.completion_choice(_generate_choice(4, None), 0, prompt_tokens=5,
                                 routing_asked=True)
    aborted = _generate_choice(2, np.zeros((3, 3, 2), dtype=np.uint8), finish="abort")
    assert routes.completion_choice(aborted, 0, prompt_tokens=5,
                                    routing_asked=True)["routed_experts"] is None
    assert routes.completion_choice(_generate_choice(4, None), 0)["routed_experts"] is None


def _generate_app(bodies: list[dict]) -> web.Application:
    """A unit-tier stand-in for vLLM's generate route: routing for every position it ran on,
    the first layer's first expert naming the position."""
    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m", "owned_by": "vllm"}]})

    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        bodies.append(body)
        completion = body["sampling_params"]["max_tokens"]
        routing = np.ones((len(body["token_ids"]) + completion - 1, 2, 2), dtype=np.uint8)
        routing[:, 0, 0] = np.arange(len(routing))
        return web.json_response({"choices": [_generate_choice(completion, routing)]})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post(routes.GENERATE, generate)
    return app


async def test_the_client_reads_vllms_routing_as_it_sends_it():
    """Through the client: the completion's routing is vLLM's, position for position over the
    prompt and the sampled tokens but the last, and no routing field reaches vLLM's sampling
    parameters (vLLM has no such request switch)."""
    bodies: list[dict] = []
    port = _free_port()
    runner = await _serve(_generate_app(bodies), port)
    try:
        async with InferenceClient([f"http://127.0.0.1:{port}"],
                                   routed_experts=True) as client:
            out = await client.complete([1, 2, 3], Sampling(max_tokens=4))
    finally:
        await runner.cleanup()
    assert out.routed_experts is not None and out.routed_experts.start == 0
    assert list(out.routed_experts.array()[:, 0, 0]) == list(range(6))
    assert not any("routed" in key for key in bodies[0]["sampling_params"])


def test_routing_replay_on_vllm_without_a_gpu_is_refused_before_it_starts(tmp_path):
    """vLLM returns routing only from its Model Runner V2 (Triton, so CUDA): on a CPU the
    launcher refuses in one line before anything starts, whether vLLM is installed or not; on
    a GPU the server is started with vLLM's switch."""
    routed = VLLMOptions(model=str(tmp_path), routed_experts=True, device="cpu")
    with pytest.raises(UserError, match="Model Runner V2, which needs Triton") as refused:
        vllm_server(routed)
    assert "\n" not in str(refused.value)
    gpu = vllm_command("python", replace(routed, device="cuda"), Path("/run/x/s"), "cuda")
    assert "--enable-return-routed-experts" in gpu and "--enable-prefix-caching" in gpu
    plain = vllm_command("python", replace(routed, routed_experts=False), Path("/s"), "cuda")
    assert "--enable-return-routed-experts" not in plain
