"""Harbor's inference relay, with our connector and capture proxy at its training end.

A job submitted to a real `harbor serve` with `relay_inference` on runs Harbor's own agent
(terminus-2, unmodified) in our sandbox; every model call goes agent -> Harbor's relay ->
WebSocket -> our connector -> the capture proxy -> the embedded server, and each rollout is
recorded in a session of its own holding exactly the ids the server sampled (a tap in front of
the server says which)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from fastapi import FastAPI, Request, WebSocket  # module level: FastAPI reads the annotations

from skyrl_agent.capture import CaptureProxy
from skyrl_agent.data.run_dir import RunDir, RunRecord
from skyrl_agent.data.store import TrajectoryStore
from skyrl_agent.harbor.relay import RelayConnector
from skyrl_agent.harbor.relay_job import job_trajectories, wait_for_job
from skyrl_agent.harbor.serve import free_port, harbor_serve
from skyrl_agent.inference.client import InferenceClient
from skyrl_agent.llm.session import LLMSession, SessionConfig
from tests.conftest import DEMO
from tests.tap_server import TapServer
from tests.test_blackbox import long_tiny_model_dir, server_url, tokenizer  # noqa: F401
from tests.test_cli import run

pytestmark = pytest.mark.slow
OUR_ENVIRONMENT = "skyrl_agent.harbor:SkyrlEnvironment"
SETTINGS = SessionConfig(max_tokens=48, max_context_tokens=8192)


@pytest.fixture(autouse=True)
def _offline_litellm(monkeypatch):
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def job_config(work_root: Path, attempts: int) -> dict[str, Any]:
    return {
        "job_name": "relay-test", "n_attempts": attempts, "n_concurrent_trials": attempts,
        "retry": {"max_retries": 0},
        "tasks": [{"path": str(DEMO / "hello-file")}],
        "agents": [{"name": "terminus-2", "model_name": "openai/skyrl-agent", "kwargs": {
            "max_turns": 2, "record_terminal_session": False,
            "model_info": {"max_input_tokens": 8192, "max_output_tokens": 48,
                           "input_cost_per_token": 0.0, "output_cost_per_token": 0.0}}}],
        "environment": {"import_path": OUR_ENVIRONMENT, "kwargs": {"work_root": str(work_root)}},
    }


@dataclass
class RelayedJob:
    job: Any
    rollouts: Any
    tap: TapServer
    log: Path
    listed: list[Any]
    """Harbor's rollouts of the job."""
    details: list[Any]
    """The same, in detail (rewards, errors)."""


async def run_relayed(tmp_path: Path, url: str, tokenizer: Any,  # noqa: F811
                      config_for: Callable[[str], dict[str, Any]]) -> RelayedJob:
    """Submit `config_for(relay_url)` to a real `harbor serve` with the relay on, our connector
    feeding a capture proxy in front of a tapped server; wait for the job to end."""
    from harbor.client import AsyncHarbor

    with harbor_serve(tmp_path) as harbor:
        async with (TapServer(url) as tap, InferenceClient([tap.url]) as client,
                    CaptureProxy() as proxy):
            rollouts = proxy.open_rollouts(
                lambda rollout: LLMSession(client, tokenizer, SETTINGS, session_id=rollout))
            connector = RelayConnector(harbor.url, harbor.api_key, proxy.url, rollouts.key)
            connection = asyncio.create_task(connector.run())
            try:
                await asyncio.wait_for(connector.ready.wait(), 30)
                async with AsyncHarbor(base_url=harbor.url, api_key=harbor.api_key) as api:
                    submitted = await api.jobs.submit(config_for(harbor.url),
                                                      relay_inference=True,
                                                      session_id=connector.session_id)
                    job = await wait_for_job(api, submitted.job_id, timeout_s=600)
                    listed = (await api.rollouts.list(job_ids=[job.id])).items
                    details = [await api.rollouts.get(r.id) for r in listed]
            finally:
                connection.cancel()
    return RelayedJob(job, rollouts, tap, harbor.log, listed, details)


async def test_a_relayed_harbor_job_is_recorded_per_rollout_token_exact(
        tmp_path, work_root, server_url, tokenizer):  # noqa: F811
    relayed = await run_relayed(tmp_path, server_url, tokenizer,
                                lambda _: job_config(work_root, 2))
    job, rollouts, tap, harbor_log = relayed.job, relayed.rollouts, relayed.tap, relayed.log
    listed, details = relayed.listed, relayed.details
    assert job.state == "finished", harbor_log.read_text()[-3000:]
    assert len(listed) == 2
    # One session per rollout, under Harbor's own rollout ids.
    assert set(rollouts.sessions) == {str(r.id) for r in listed}, harbor_log.read_text()[-3000:]
    turns = [turn for session in rollouts.sessions.values()
             for segment in session.llm.segments for turn in segment.turns]
    assert all(len(requests) >= 1 for requests in rollouts.requests.values())
    assert len(turns) == len(tap.calls) >= 2
    recorded = sorted((list(t.prompt_ids), list(t.completion_ids), list(t.completion_logprobs))
                      for t in turns)
    assert recorded == sorted(tap.sampled())  # the ids the server sampled, nothing else
    for session in rollouts.sessions.values():
        for segment in session.llm.segments:
            assert segment.is_token_consistent()
    # The job as trajectories of a run dir: Harbor's rewards, our recorded turns, read by eval.
    hello = (DEMO / "hello-file").resolve()
    trajectories = job_trajectories(details, rollouts, "terminus-2", {hello: "demo/hello-file"})
    in_order = sorted(listed, key=lambda r: (r.created_at, str(r.id)))
    assert [(t.task_id, t.sample_index) for t in trajectories] == [
        ("demo/hello-file", 0), ("demo/hello-file", 1)]
    assert [t.reward.value for t in trajectories] == [
        float((r.rewards or {}).get("reward") or 0.0) for r in in_order]
    assert [t.metrics["completion_tokens"] for t in trajectories] == [
        sum(len(turn.completion_ids) for s in t.segments for turn in s.turns)
        for t in trajectories]  # what eval reports of the rollout
    assert [t.num_turns for t in trajectories] == [
        sum(len(s.turns) for s in rollouts.sessions[str(r.id)].llm.segments) for r in in_order]
    run_dir = tmp_path / "run"
    RunDir(run_dir).prepare(RunRecord(1, {"inference": {"model": "smollm2-135m"}}))
    store = TrajectoryStore(run_dir, writable=True)
    store.append(trajectories)
    store.close()
    result = run("eval", str(run_dir))
    assert result.returncode == 0 and "reward mean" in result.stdout, result.stderr


async def test_a_wrong_harbor_key_is_refused_in_one_error(tmp_path):
    from skyrl_agent.harbor.relay import RelayRefused

    with harbor_serve(tmp_path) as harbor:
        connector = RelayConnector(harbor.url, "not-the-key", "http://127.0.0.1:9", "k")
        with pytest.raises(RelayRefused, match="401"):
            await asyncio.wait_for(connector.run(), 30)
    assert connector.connections == 0


# ---- Harbor's relay in this process: cancellation and a dropped connection ------------------

@contextlib.asynccontextmanager
async def harbor_relay() -> AsyncIterator[tuple[Any, str]]:
    """Harbor's own Relay behind its two routes (as `harbor serve` mounts them, minus its
    authentication), so a test can register rollout tokens and cut connections."""
    import uvicorn
    from harbor.server.relay import PREFIX, Relay

    port = free_port()
    relay = Relay(f"http://127.0.0.1:{port}{PREFIX}")
    app = FastAPI()

    @app.post(PREFIX + "/{path:path}")
    async def inference(request: Request) -> Any:
        return await relay.http(request)

    @app.websocket("/connect")
    async def connect(socket: WebSocket, session_id: str) -> None:
        await relay.connect(socket, ("owner", session_id))

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    try:
        yield relay, f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await serving


@dataclass
class SlowProxy:
    """Stands in for the capture proxy (this test is about the connector): answers at once,
    or never when the body asks for `slow`; records the forwards that were cancelled."""

    answered: list[tuple[str, str]] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    started: list[str] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        request_id = request.match_info["request"]
        body = await request.json()
        if body.get("slow"):
            self.started.append(request_id)
            try:
                await asyncio.sleep(120)
            except asyncio.CancelledError:
                self.cancelled.append(request_id)
                raise
        self.answered.append((request_id, request.headers.get("Authorization", "")))
        return web.json_response({"answered": request_id})


async def _until(condition: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


async def test_a_cancelled_request_stops_its_forward_and_a_dropped_connection_is_reopened():
    import aiohttp

    proxy = SlowProxy()
    app = web.Application()
    app.router.add_post("/r/rollout_id/{rollout}/request_id/{request}/v1/chat/completions",
                        proxy.handle)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    proxy_url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    async with harbor_relay() as (relay, url), aiohttp.ClientSession() as http:
        connector = RelayConnector(url, "unused", proxy_url, "proxy-key", session_id="s1")
        connection = asyncio.create_task(connector.run())
        try:
            await asyncio.wait_for(connector.ready.wait(), 20)
            token = relay.register("owner", "job", "rollout-1", "s1")
            call = f"{url}/inference/v1/chat/completions"
            auth = {"Authorization": f"Bearer {token}"}

            async def fast() -> int:
                async with http.post(call, json={}, headers=auth) as answer:
                    assert (await answer.json())["answered"]
                    return answer.status

            assert await fast() == 200
            # The proxy sees our key, never the rollout's token.
            assert proxy.answered[-1][1] == "Bearer proxy-key"
            # The agent gives up on a call: Harbor sends `cancel`, the forward stops.
            abandoned = asyncio.create_task(http.post(call, json={"slow": True}, headers=auth))
            await _until(lambda: proxy.started)
            abandoned.cancel()
            await _until(lambda: proxy.cancelled == proxy.started)
            await _until(lambda: not connector._inflight)
            # The connection drops: the connector comes back and serves the next call.
            for held in list(relay.connections.values()):
                await held.socket.close()
            await _until(lambda: connector.connections == 2 and connector.ready.is_set())
            assert await fast() == 200
        finally:
            connection.cancel()
            await runner.cleanup()


@pytest.mark.parametrize("target", ["/v1/../s/KEY/v1/chat/completions", "//elsewhere/v1",
                                    "/v1/./chat", "http://host/v1/chat/completions",
                                    "/v1/chat completions"])
def test_a_relayed_path_that_leaves_the_capture_routes_is_refused(target):
    """Attack: relayed agent traffic names a path that climbs out of its rollout's capture
    route (to another key's session, or another host). It is refused before any forward."""
    from pydantic import ValidationError

    from skyrl_agent.harbor.relay import _Request

    message = {"type": "request", "rollout_id": "r", "request_id": "q", "method": "POST",
               "headers": [], "body_b64": ""}
    with pytest.raises(ValidationError):
        _Request.model_validate({**message, "target": target})
    assert _Request.model_validate({**message, "target": "/v1/chat/completions"})


async def _two_turns(kind: str, base: str, token: str) -> None:
    """A two-turn conversation in one wire format, through the official client library: the
    second call echoes the first reply back, as agents do."""
    if kind == "messages":
        from anthropic import AsyncAnthropic

        async with AsyncAnthropic(base_url=base, api_key=token, max_retries=0) as anthropic:
            history: list[Any] = [{"role": "user", "content": "Say hello."}]
            first = await anthropic.messages.create(model="skyrl-agent", max_tokens=16,
                                                    messages=history)
            history += [{"role": "assistant",
                         "content": [block.model_dump() for block in first.content]},
                        {"role": "user", "content": "Again."}]
            await anthropic.messages.create(model="skyrl-agent", max_tokens=16,
                                            messages=history)
        return
    from openai import AsyncOpenAI

    async with AsyncOpenAI(base_url=f"{base}/v1", api_key=token, max_retries=0) as openai:
        if kind == "chat":
            chat: list[Any] = [{"role": "user", "content": "Say hello."}]
            reply = await openai.chat.completions.create(model="skyrl-agent", messages=chat,
                                                         max_tokens=16)
            chat += [{"role": "assistant", "content": reply.choices[0].message.content},
                     {"role": "user", "content": "Again."}]
            await openai.chat.completions.create(model="skyrl-agent", messages=chat,
                                                 max_tokens=16)
            return
        items: list[Any] = [{"role": "user", "content": "Say hello."}]
        response = await openai.responses.create(model="skyrl-agent", input=items,
                                                 max_output_tokens=16)
        items += [item.model_dump(exclude_none=True) for item in response.output]
        items.append({"role": "user", "content": "Again."})
        await openai.responses.create(model="skyrl-agent", input=items, max_output_tokens=16)


async def test_every_wire_format_is_relayed_and_recorded_token_exact(
        server_url, tokenizer):  # noqa: F811
    """Chat completions, Responses and Messages, each from its own client library, through
    Harbor's relay and our connector: each rollout's turns are the ids the server sampled, and
    the echoed reply continues the same segment."""
    async with (harbor_relay() as (relay, url), TapServer(server_url) as tap,
                InferenceClient([tap.url]) as client, CaptureProxy() as proxy):
        rollouts = proxy.open_rollouts(
            lambda rollout: LLMSession(client, tokenizer, SETTINGS, session_id=rollout))
        connector = RelayConnector(url, "unused", proxy.url, rollouts.key, session_id="s1")
        connection = asyncio.create_task(connector.run())
        try:
            await asyncio.wait_for(connector.ready.wait(), 20)
            for kind in ("chat", "responses", "messages"):
                token = relay.register("owner", "job", f"rollout-{kind}", "s1")
                await _two_turns(kind, f"{url}/inference", token)
        finally:
            connection.cancel()
    assert set(rollouts.sessions) == {"rollout-chat", "rollout-responses", "rollout-messages"}
    turns = []
    for rollout, session in rollouts.sessions.items():
        (segment,) = session.llm.segments  # the echo joined the first turn's segment
        assert len(segment.turns) == 2 and segment.is_token_consistent(), rollout
        assert len(rollouts.requests[rollout]) == 2
        turns += segment.turns
    recorded = sorted((list(t.prompt_ids), list(t.completion_ids), list(t.completion_logprobs))
                      for t in turns)
    assert recorded == sorted(tap.sampled())
