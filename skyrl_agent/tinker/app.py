"""HTTP routes of the Tinker API (`/api/v1/...`), as the SDK calls them.

JSON bodies are parsed with the SDK's own request types, so a field the SDK sends is never
silently dropped; forward_backward bodies are protobuf. A malformed body answers 400 with one
line (the SDK raises it at once, no retry); errors found while running a request fail its
future with category `user` or `server`. retrieve_future long-polls for up to `poll_s`, then
answers try_again; an id the server does not know answers 410 (the SDK resends the request).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ValidationError

from skyrl_agent.backends.backend import AdamParams
from skyrl_agent.inference.auth import key_matches, presented_key, unauthorized
from skyrl_agent.tinker.config import CHUNK_BYTES, max_body_bytes
from skyrl_agent.tinker.errors import TinkerNotFound, TinkerUserError
from skyrl_agent.tinker.proto import decode_forward_backward
from skyrl_agent.tinker.rest import TENANT, RestRoutes
from skyrl_agent.tinker.service import TinkerService

log = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PROTO = "application/x-protobuf"
HEALTH = "/api/v1/healthz"


def _types() -> Any:
    import tinker.types as types

    return types


def _detail(status: int, message: str) -> web.Response:
    return web.json_response({"detail": message}, status=status)


def _future(request_id: str, model_id: str | None = None, **extra: Any) -> web.Response:
    return web.json_response({"request_id": request_id, "model_id": model_id, **extra})


class TinkerApp:
    """The aiohttp application over one TinkerService. Every route but the health check needs
    a tenant's key (the SDK sends it as X-API-Key; `Authorization: Bearer` works too); what a
    request does is done as that tenant."""

    def __init__(self, service: TinkerService, keys: Mapping[str, str]) -> None:
        self.service = service
        self.types = _types()
        self.keys = dict(keys)
        """Tenant name -> its API key."""
        self.max_body = max_body_bytes(service.bases.max_context())

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._authenticate, self._errors],
                              client_max_size=self.max_body)
        post = {
            "client/config": self.client_config, "create_session": self.create_session,
            "session_heartbeat": self.heartbeat, "create_model": self.create_model,
            "get_info": self.get_info, "forward_backward": self.forward_backward,
            "optim_step": self.optim_step, "save_weights": self.save_weights,
            "load_weights": self.load_weights,
            "save_weights_for_sampler": self.save_weights_for_sampler,
            "create_sampling_session": self.create_sampling_session,
            "asample": self.asample, "retrieve_future": self.retrieve_future,
            "telemetry": self.telemetry,
        }
        for path, handler in post.items():
            app.router.add_post(f"/api/v1/{path}", handler)
        app.router.add_get("/api/v1/get_server_capabilities", self.capabilities)
        app.router.add_get(HEALTH, self.ok)
        app.router.add_get("/api/v1/samplers/{sampler_id}", self.get_sampler)
        app.router.add_post("/api/v1/sessions/{session_id}/finish", self.finish_session)
        RestRoutes(self.service.catalog).add_to(app)
        app.on_cleanup.append(lambda _app: self.service.close())
        return app

    @web.middleware
    async def _authenticate(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == HEALTH:
            return await handler(request)
        presented = presented_key(request.headers)
        tenant = next((t for t, key in self.keys.items() if key_matches(presented, key)), None)
        if tenant is None:
            return unauthorized("a valid API key is required (the key tinker-serve was "
                                "started with, or the one in its data dir's api-key file)")
        request[TENANT] = tenant
        return await handler(request)

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except TinkerNotFound as exc:
            return _detail(404, str(exc))
        except TinkerUserError as exc:
            return _detail(400, str(exc))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(map(str, first["loc"])) or "body"
            return _detail(400, f"invalid request: {where}: {first['msg']}")

    async def _body[M: BaseModel](self, request: web.Request, model: type[M]) -> M:
        try:
            payload = await request.json()
        except ValueError:
            raise TinkerUserError("the body is not JSON") from None
        return model.model_validate(payload)

    # ---- sessions and discovery -------------------------------------------------------------

    async def ok(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def telemetry(self, request: web.Request) -> web.Response:
        # Taken and dropped: the SDK sends its events by default and logs a traceback for any
        # answer but its TelemetryResponse.
        return web.json_response({"status": "accepted"})

    async def client_config(self, request: web.Request) -> web.Response:
        # Plain httpx (not pyqwest), uncompressed protobuf, chunks sent in parallel.
        return web.json_response({"use_pyqwest_transport": False,
                                  "proto_compress_fwdbwd": False,
                                  "parallel_fwdbwd_chunks": True,
                                  "fwdbwd_max_chunk_bytes_count": CHUNK_BYTES})

    async def create_session(self, request: web.Request) -> web.Response:
        body = await self._body(request, self.types.CreateSessionRequest)
        session_id = self.service.create_session(request[TENANT], body.user_metadata)
        return web.json_response({"type": "create_session", "session_id": session_id})

    async def heartbeat(self, request: web.Request) -> web.Response:
        # Sessions are kept on disk, so those from before a restart are known too. A closed
        # one answers 410, which ends the heartbeats of any client still holding it (a sampler
        # rebuilt from a handle shares its session); another tenant's is unknown (404).
        body = await self._body(request, self.types.SessionHeartbeatRequest)
        if self.service.catalog.owned_session(body.session_id, request[TENANT]).finished:
            return _detail(410, f"session {body.session_id} has finished")
        return web.json_response({"type": "session_heartbeat"})

    async def finish_session(self, request: web.Request) -> web.Response:
        """ServiceClient.close(): the session's training models are released (their saved
        checkpoints stay)."""
        await self.service.finish_session(request.match_info["session_id"], request[TENANT])
        return web.json_response(None)

    async def capabilities(self, request: web.Request) -> web.Response:
        return web.json_response(self.service.capabilities())

    # ---- training ---------------------------------------------------------------------------

    async def create_model(self, request: web.Request) -> web.Response:
        body = await self._body(request, self.types.CreateModelRequest)
        seed = body.lora_config.seed if body.lora_config else None
        request_id = self.service.create_model(body.session_id, body.model_seq_id,
                                               body.base_model, body.lora_config, seed,
                                               request[TENANT])
        return _future(request_id)

    async def get_info(self, request: web.Request) -> web.Response:
        body = await self._body(request, self.types.GetInfoRequest)
        return web.json_response(self.service.info(body.model_id, request[TENANT]))

    async def forward_backward(self, request: web.Request) -> web.Response:
        zstd = request.headers.get("Content-Encoding", "") == "zstd"
        call = decode_forward_backward(await request.read(), zstd, self.max_body)
        return _future(self.service.forward_backward(call, request[TENANT]), call.model_id)

    async def optim_step(self, request: web.Request) -> web.Response:
        body = await self._body(request, self.types.OptimStepRequest)
        params = body.optim_params
        if not isinstance(params, self.types.AdamParams):
            raise TinkerUserError("only the Adam optimizer is supported")
        try:
            adam = AdamParams(learning_rate=params.learning_rate, beta1=params.beta1,
                              beta2=params.beta2, eps=params.eps,
                              weight_decay=params.weight_decay,
                              grad_clip_norm=params.grad_clip_norm)
        except ValueError as exc:
            raise TinkerUserError(str(exc)) from None
        return _future(self.service.optim_step(body.model_id, body.seq_id, adam,
                                               request[TENANT]), body.model_id)

    async def save_weights(self, request: web.Request) -> web.Response:
        body = await self._body(request, self.types.SaveWeightsRequest)
        request_id = self.service.save_state(body.model_id, body.seq_id, body.path,
                                             body.overwrite, body.ttl_seconds, request[TENANT])
        return _future(request_id, body.model_id)

    async def load_weights(self, request: web.Request) -> web.Response:
        body = await self._body(request, self.types.LoadWeightsRequest)
        if body.session_id is not None:
            if body.model_seq_id is None:
                raise TinkerUserError("a load with session_id needs model_seq_id")
            request_id = self.service.create_from_state(body.session_id, body.model_seq_id,
                                                        body.path, body.optimizer,
                                                        request[TENANT])
            return _future(request_id, f"{body.session_id}:train:{body.model_seq_id}")
        if body.model_id is None:
            raise TinkerUserError("load_weights needs model_id or session_id")
        request_id = self.service.load_state(body.model_id, body.seq_id, body.path,
                                             body.optimizer, request[TENANT])
        return _future(request_id, body.model_id)

    async def save_weights_for_sampler(self, request: web.Request) -> web.Response:
        body = await self._body(request, self.types.SaveWeightsForSamplerRequest)
        request_id = self.service.save_for_sampler(body.model_id, body.seq_id, body.path,
                                                   body.sampling_session_seq_id,
                                                   body.ttl_seconds, request[TENANT])
        return _future(request_id, body.model_id)

    # ---- sampling ---------------------------------------------------------------------------

    async def create_sampling_session(self, request: web.Request) -> web.Response:
        body = await self._body(request, self.types.CreateSamplingSessionRequest)
        sampling_id = self.service.create_sampling_session(
            body.session_id, body.sampling_session_seq_id, body.base_model, body.model_path,
            request[TENANT])
        return web.json_response({"type": "create_sampling_session",
                                  "sampling_session_id": sampling_id})

    async def get_sampler(self, request: web.Request) -> web.Response:
        try:
            return web.json_response(self.service.sampler_info(request.match_info["sampler_id"],
                                                               request[TENANT]))
        except TinkerUserError as exc:
            return _detail(404, str(exc))

    async def asample(self, request: web.Request) -> web.Response:
        body = await self._body(request, self.types.SampleRequest)
        request_id, sequence_ids = self.service.sample(body, request[TENANT])
        return _future(request_id, sample_sequence_ids=sequence_ids)

    # ---- futures ----------------------------------------------------------------------------

    async def retrieve_future(self, request: web.Request) -> web.Response:
        body = await self._body(request, self.types.FutureRetrieveRequest)
        try:
            result = await self.service.futures.wait(body.request_id, self.service.options.poll_s,
                                                     request[TENANT])
        except KeyError:
            return _detail(410, f"unknown request {body.request_id} (expired, or sent to this "
                                "server before it restarted)")
        if result is None:
            return web.json_response({"type": "try_again", "request_id": body.request_id,
                                      "queue_state": "active"})
        if result.error is not None:
            return web.json_response({"error": result.error, "category": result.category})
        if result.proto is not None:
            return web.Response(body=result.proto, content_type=PROTO)
        return web.json_response(result.json)
