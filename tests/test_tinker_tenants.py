"""Tinker tenants over real HTTP (an in-process server on 127.0.0.1, the char model: real LoRA
backends in seconds): every route that takes an id refuses another tenant's, every request
field is bounded, and each tenant's training models are held to its quota."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from skyrl_agent.inference.bounds import (
    MAX_METADATA_ENTRIES,
    MAX_N,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    MAX_TOPK_PROMPT_LOGPROBS,
    MAX_TTL_SECONDS,
)
from skyrl_agent.tinker.app import TinkerApp
from skyrl_agent.tinker.config import ServiceOptions, TenantQuota
from skyrl_agent.tinker.quotas import GIB, trained_bytes
from skyrl_agent.tinker.rest import REFUSED
from skyrl_agent.tinker.service import TinkerService
from tests.tiny_models import char_model_dir

pytest.importorskip("tinker")
KEYS = {"alice": "tml-alice-key", "bob": "tml-bob-key"}
TAKES_NO_ID = {
    ("GET", "/api/v1/healthz"),
    ("GET", "/api/v1/get_server_capabilities"),
    ("POST", "/api/v1/client/config"),
    ("POST", "/api/v1/create_session"),
    ("POST", "/api/v1/telemetry"),
    ("GET", "/api/v1/training_runs"),
    ("GET", "/api/v1/checkpoints"),
    ("GET", "/api/v1/sessions"),
}
"""Routes that name nothing of anyone's (the listings are checked to show only the caller's)."""


@dataclass
class Tenant:
    http: aiohttp.ClientSession
    api: str

    async def call(
        self, method: str, path: str, body: Any = None, data: bytes | None = None
    ) -> tuple[int, Any]:
        async with self.http.request(method, f"{self.api}/{path}", json=body, data=data) as reply:
            return reply.status, await reply.json(content_type=None)

    async def result(self, path: str, body: Any = None, data: bytes | None = None) -> Any:
        """A future's outcome: its JSON, or {"error": ...} when it failed."""
        status, reply = await self.call("POST", path, body, data)
        assert status == 200 and "request_id" in reply, (path, status, reply)
        while True:
            status, answer = await self.call(
                "POST", "retrieve_future", {"request_id": reply["request_id"]}
            )
            assert status == 200, answer
            if answer.get("type") != "try_again":
                return answer

    async def ok(self, path: str, body: Any = None) -> Any:
        answer = await self.result(path, body)
        assert "error" not in answer, (path, answer)
        return answer

    async def session(self, **extra: Any) -> str:
        status, reply = await self.call(
            "POST",
            "create_session",
            {"tags": [], "user_metadata": None, "sdk_version": "0", **extra},
        )
        assert status == 200, reply
        return reply["session_id"]

    async def model(self, session: str, seq: int, rank: int = 4) -> Any:
        return await self.result(
            "create_model",
            {
                "session_id": session,
                "model_seq_id": seq,
                "base_model": "tiny",
                "lora_config": {"rank": rank},
            },
        )


@contextlib.asynccontextmanager
async def tinker_server(
    tmp_path: Path,
    quota: TenantQuota | None = None,
) -> AsyncIterator[tuple[dict[str, Tenant], web.Application]]:
    folder = char_model_dir(tmp_path / "char", hidden=16, layers=1)
    service = TinkerService(
        ServiceOptions(
            data_dir=tmp_path / "data",
            poll_s=0.2,
            quota=quota or TenantQuota(),
            models=(f"tiny={folder}",),
        )
    )
    app = TinkerApp(service, KEYS).app()
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    api = f"http://127.0.0.1:{runner.addresses[0][1]}/api/v1"
    sessions = {
        name: aiohttp.ClientSession(headers={"X-API-Key": key}) for name, key in KEYS.items()
    }
    try:
        yield {name: Tenant(http, api) for name, http in sessions.items()}, app
    finally:
        await asyncio.gather(*(http.close() for http in sessions.values()))
        await runner.cleanup()


def _sample(**fields: Any) -> dict[str, Any]:
    return {
        "num_samples": 1,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}]},
        "sampling_params": {"max_tokens": 2},
        **fields,
    }


def _forward(model_id: str) -> bytes:
    from skyrl_agent.tinker.proto import public_pb

    return (
        public_pb()
        .ForwardBackwardRequest(model_id=model_id, loss_fn="cross_entropy")
        .SerializeToString()
    )


async def test_every_route_refuses_another_tenants_ids(tmp_path):
    """Stops one tenant from using, changing or reading what another owns through any route
    that takes an id. The attack found: create_sampling_session with another tenant's session
    (its ids show in a published checkpoint's run id) succeeded and overwrote the owner's
    sampling session, whose sampler then answered 404. Walks every route the server has (a new
    one fails here until it is walked too), with Alice's ids as Bob."""
    async with tinker_server(tmp_path) as (tenants, app):
        alice, bob = tenants["alice"], tenants["bob"]
        session = await alice.session()
        model = (await alice.model(session, 0))["model_id"]
        state = (await alice.ok("save_weights", {"model_id": model, "path": "s1"}))["path"]
        weights = (await alice.ok("save_weights_for_sampler", {"model_id": model, "path": "w1"}))[
            "path"
        ]
        ephemeral = (
            await alice.ok(
                "save_weights_for_sampler", {"model_id": model, "sampling_session_seq_id": 1}
            )
        )["sampling_session_id"]
        status, reply = await alice.call(
            "POST",
            "create_sampling_session",
            {"session_id": session, "sampling_session_seq_id": 0, "model_path": weights},
        )
        assert status == 200, reply
        sampler = reply["sampling_session_id"]
        _, pending = await alice.call(
            "POST", "optim_step", {"model_id": model, "adam_params": {"learning_rate": 0.01}}
        )
        bob_session = await bob.session()
        bob_model = (await bob.model(bob_session, 0))["model_id"]
        run, kind, name = state.removeprefix("tinker://").split("/")
        checkpoint = f"training_runs/{run}/checkpoints/{kind}/{name}"

        refused_now = {  # route -> (method, path, body), answered 404 or 410 at once
            ("POST", "/api/v1/session_heartbeat"): (
                "POST",
                "session_heartbeat",
                {"session_id": session},
            ),
            ("POST", "/api/v1/sessions/{session_id}/finish"): (
                "POST",
                f"sessions/{session}/finish",
                None,
            ),
            ("POST", "/api/v1/create_model"): (
                "POST",
                "create_model",
                {
                    "session_id": session,
                    "model_seq_id": 7,
                    "base_model": "tiny",
                    "lora_config": {"rank": 4},
                },
            ),
            ("POST", "/api/v1/create_sampling_session"): (
                "POST",
                "create_sampling_session",
                {"session_id": session, "sampling_session_seq_id": 0, "base_model": "tiny"},
            ),
            ("POST", "/api/v1/get_info"): ("POST", "get_info", {"model_id": model}),
            ("GET", "/api/v1/samplers/{sampler_id}"): ("GET", f"samplers/{sampler}", None),
            ("POST", "/api/v1/asample"): (
                "POST",
                "asample",
                _sample(sampling_session_id=sampler, seq_id=0),
            ),
            ("POST", "/api/v1/retrieve_future"): (
                "POST",
                "retrieve_future",
                {"request_id": pending["request_id"]},
            ),
            ("GET", "/api/v1/training_runs/{run}"): ("GET", f"training_runs/{run}", None),
            ("GET", "/api/v1/training_runs/{run}/checkpoints"): (
                "GET",
                f"training_runs/{run}/checkpoints",
                None,
            ),
            ("DELETE", "/api/v1/training_runs/{run}/checkpoints/{kind}/{name}"): (
                "DELETE",
                checkpoint,
                None,
            ),
            ("POST", "/api/v1/training_runs/{run}/checkpoints/{kind}/{name}/publish"): (
                "POST",
                f"{checkpoint}/publish",
                None,
            ),
            ("DELETE", "/api/v1/training_runs/{run}/checkpoints/{kind}/{name}/publish"): (
                "DELETE",
                f"{checkpoint}/publish",
                None,
            ),
            ("PUT", "/api/v1/training_runs/{run}/checkpoints/{kind}/{name}/ttl"): (
                "PUT",
                f"{checkpoint}/ttl",
                {"ttl_seconds": 3600},
            ),
            ("POST", "/api/v1/weights_info"): ("POST", "weights_info", {"tinker_path": state}),
            ("GET", "/api/v1/sessions/{session_id}"): ("GET", f"sessions/{session}", None),
        }
        for method, path, body in refused_now.values():
            status, reply = await bob.call(method, path, body)
            assert status in (404, 410), (path, status, reply)
        # Same refusals through other routes' other ids.
        for path, body in [
            (
                "create_sampling_session",
                {"session_id": bob_session, "sampling_session_seq_id": 5, "model_path": weights},
            ),
            ("asample", _sample(model_path=weights)),
            ("asample", _sample(sampling_session_id=ephemeral, seq_id=0)),
            (
                "load_weights",
                {"session_id": session, "model_seq_id": 8, "path": state, "optimizer": False},
            ),
        ]:
            status, reply = await bob.call("POST", path, body)
            assert status == 404, (path, status, reply)
        assert (await bob.call("GET", f"samplers/{ephemeral}"))[0] == 404

        failed_future = {  # route -> (path, body or protobuf): its future fails
            ("POST", "/api/v1/forward_backward"): ("forward_backward", _forward(model)),
            ("POST", "/api/v1/optim_step"): (
                "optim_step",
                {"model_id": model, "adam_params": {"learning_rate": 0.01}},
            ),
            ("POST", "/api/v1/save_weights"): ("save_weights", {"model_id": model, "path": "mine"}),
            ("POST", "/api/v1/load_weights"): (
                "load_weights",
                {"model_id": model, "path": state, "optimizer": False},
            ),
            ("POST", "/api/v1/save_weights_for_sampler"): (
                "save_weights_for_sampler",
                {"model_id": model, "path": "mine"},
            ),
        }
        for path, body in failed_future.values():
            data = body if isinstance(body, bytes) else None
            answer = await bob.result(path, None if data else body, data)
            assert "unknown model" in answer.get("error", ""), (path, answer)
        answer = await bob.result(
            "load_weights", {"model_id": bob_model, "path": state, "optimizer": False}
        )
        assert "no checkpoint" in answer.get("error", ""), answer

        # Every route is walked, takes no id, or is refused to everyone.
        served = {
            (r.method, r.resource.canonical)
            for r in app.router.routes()
            if r.method != "HEAD" and r.resource is not None
        }
        walked = set(refused_now) | set(failed_future) | TAKES_NO_ID | set(REFUSED)
        assert served == walked, served ^ walked
        for method, path in REFUSED:
            status, _ = await bob.call(
                method,
                path.removeprefix("/api/v1/").format(
                    run=run, kind=kind, name=name, session_id=session
                ),
            )
            assert status == 400, path
        # The listings show Bob only his own.
        for path, key, item in [
            ("training_runs?access_scope=accessible", "training_runs", "training_run_id"),
            ("checkpoints", "checkpoints", "tinker_path"),
            ("sessions", "sessions", None),
        ]:
            status, reply = await bob.call("GET", path)
            found = [x if item is None else x[item] for x in reply[key]]
            assert status == 200 and not {model, state, weights, session} & set(found), found

        # Alice's things are as she left them.
        status, info = await alice.call("GET", f"samplers/{sampler}")
        assert status == 200 and info["model_path"] == weights, info
        assert (await alice.call("GET", f"samplers/{ephemeral}"))[0] == 200
        assert (await alice.call("POST", "session_heartbeat", {"session_id": session}))[0] == 200
        assert (await alice.call("POST", "get_info", {"model_id": model}))[0] == 200
        assert "error" not in await alice.result("save_weights", {"model_id": model, "path": "s2"})
        _, listed = await alice.call("GET", f"training_runs/{run}/checkpoints")
        assert {state, weights} <= {c["tinker_path"] for c in listed["checkpoints"]}
        # Ids are random: nothing to count up from.
        assert len(session) == 32 and len(pending["request_id"]) == 32


async def test_each_tenant_is_held_to_its_quota(tmp_path):
    """Stops one tenant from taking the memory every tenant trains in: LoRA rank 512 on a 135M
    model (more parameters than the model) was accepted, and so was any number of models.
    Rank, live models and their estimated memory are each refused with one line, per tenant;
    a finished session gives its share back."""
    folder = char_model_dir(tmp_path / "sizing", hidden=16, layers=1)
    from skyrl_agent.tinker.config import BaseModels
    from skyrl_agent.tinker.models import lora_spec

    base = BaseModels([f"tiny={folder}"]).get("tiny")
    rank8 = trained_bytes(base, lora_spec(base, 8))
    quota = TenantQuota(max_lora_rank=64, max_models=2, max_memory_gb=1.5 * rank8 / GIB)
    async with tinker_server(tmp_path, quota) as (tenants, _):
        alice, bob = tenants["alice"], tenants["bob"]
        session = await alice.session()
        answer = await alice.model(session, 0, rank=65)
        assert "LoRA rank 65 is above this server's limit of 64" in answer["error"], answer
        assert "\n" not in answer["error"] and answer["category"] == "user"
        assert "model_id" in await alice.model(session, 1, rank=8)
        answer = await alice.model(session, 2, rank=8)
        assert "GiB quota" in answer.get("error", ""), answer
        assert "model_id" in await alice.model(session, 3, rank=2)
        answer = await alice.model(session, 4, rank=2)
        assert "already has 2 training models" in answer.get("error", ""), answer
        assert "model_id" in await bob.model(await bob.session(), 0, rank=8)  # his own quota
        assert (await alice.call("POST", f"sessions/{session}/finish"))[0] == 200
        assert "model_id" in await alice.model(await alice.session(), 0, rank=8)


async def test_each_tinker_request_field_is_bounded(tmp_path):
    """Stops one request from slowing or filling the server: stop strings and ids (checked by
    the sampler after every token), samples, prompt top-k, a session's stored metadata and a
    checkpoint's lifetime (10**400 seconds was an HTTP 500) are refused at bound + 1 with one
    line."""
    async with tinker_server(tmp_path) as (tenants, _):
        alice = tenants["alice"]
        cases = [
            (
                "asample",
                _sample(
                    base_model="tiny",
                    sampling_params={"max_tokens": 2, "stop": ["x"] * (MAX_STOP_STRINGS + 1)},
                ),
                "stop strings",
            ),
            (
                "asample",
                _sample(
                    base_model="tiny",
                    sampling_params={"max_tokens": 2, "stop": "x" * (MAX_STOP_CHARS + 1)},
                ),
                "stop strings",
            ),
            (
                "asample",
                _sample(
                    base_model="tiny",
                    sampling_params={"max_tokens": 2, "stop": [1] * (MAX_STOP_TOKEN_IDS + 1)},
                ),
                "stop_token_ids",
            ),
            ("asample", _sample(base_model="tiny", num_samples=MAX_N + 1), "num_samples"),
            (
                "asample",
                _sample(
                    base_model="tiny",
                    prompt_logprobs=True,
                    topk_prompt_logprobs=MAX_TOPK_PROMPT_LOGPROBS + 1,
                ),
                "topk",
            ),
            (
                "create_session",
                {
                    "tags": [],
                    "sdk_version": "0",
                    "user_metadata": {str(i): "v" for i in range(MAX_METADATA_ENTRIES + 1)},
                },
                "user_metadata",
            ),
        ]
        session = await alice.session()
        model = (await alice.model(session, 0))["model_id"]
        for field in ("save_weights", "save_weights_for_sampler"):
            for ttl in (MAX_TTL_SECONDS + 1, 10**400, 0):
                cases.append(
                    (field, {"model_id": model, "path": "p", "ttl_seconds": ttl}, "ttl_seconds")
                )
        for path, body, words in cases:
            status, reply = await alice.call("POST", path, body)
            assert status == 400 and words in reply["detail"], (path, status, reply)
            assert "\n" not in reply["detail"]
        state = (
            await alice.ok(
                "save_weights", {"model_id": model, "path": "s", "ttl_seconds": MAX_TTL_SECONDS}
            )
        )["path"]
        run, kind, name = state.removeprefix("tinker://").split("/")
        status, reply = await alice.call(
            "PUT", f"training_runs/{run}/checkpoints/{kind}/{name}/ttl", {"ttl_seconds": 10**400}
        )
        assert status == 400 and "ttl_seconds" in reply["detail"], reply
