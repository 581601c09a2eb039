"""The training side of Harbor's inference relay: a connector from `harbor serve` to our
capture proxy.

With `relay_inference: true` on a job, Harbor points each rollout's agent at its relay
(`.../inference/v1`, a per-rollout token) and sends every model call, untranslated, over one
WebSocket to whoever holds the job's session (`/connect?session_id=...`, Bearer
HARBOR_API_KEY). Harbor ships the relay and its message protocol, not this end: the connector
takes each `request` message, sends it to the capture proxy at
`/r/rollout_id/R/request_id/Q/<path>` under the proxy's relay key (open_rollouts), and streams
the answer back as `response_start`, `response_chunk`s and `response_end` (or an `error`).

Everything arriving here is relayed agent traffic and stays untrusted: messages are
size-bounded and validated, paths are confined to the proxy's capture routes, at most `limits`
requests run at once, a `cancel` stops its forward, and a dropped connection is reopened
(Harbor fails the requests that were in flight; they are not replayed).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential

log = logging.getLogger(__name__)
API_VERSION = "2026-10-30"
"""The Harbor API version this connector speaks (harbor.constants.HARBOR_API_VERSION)."""


@dataclass(frozen=True)
class RelayLimits:
    """Bounds on what the relay may make the connector do (Harbor's own RelayLimits)."""

    message_bytes: int = 16 * 1024 * 1024
    """Largest WebSocket message either way."""
    requests: int = 256
    """Requests forwarded at once; more are answered with an `error`."""
    chunk_bytes: int = 1024 * 1024
    """Response body bytes per `response_chunk` (base64 grows them by a third)."""
    forward_timeout_s: float = 1800.0
    """One forwarded request's deadline (Harbor's own I/O wait)."""


class RelayRefused(RuntimeError):
    """Harbor refused the connection (a wrong key, or the session already has a connector)."""


class _Request(BaseModel):
    """A relayed request, as Harbor sends it."""

    model_config = ConfigDict(extra="ignore")
    type: str
    rollout_id: str = Field(min_length=1, max_length=200)
    request_id: str = Field(min_length=1, max_length=200)
    method: str = Field(pattern=r"^(GET|POST)$")
    target: str = Field(max_length=2200,  # path segments never start with a dot: no `..`
                        pattern=r"^(/[A-Za-z0-9_-][A-Za-z0-9_.-]{0,40}){1,6}(\?[^#\s]{0,2000})?$")
    headers: list[tuple[str, str]] = Field(max_length=128)
    body_b64: str


_FORWARDED = {"content-type", "accept", "openai-beta", "anthropic-version", "anthropic-beta"}
"""Request headers the proxy gets; credentials never come through (Harbor strips them)."""


class RelayConnector:
    """One connection to a Harbor relay session, forwarding to one capture proxy key."""

    def __init__(self, relay_url: str, api_key: str, proxy_url: str, proxy_key: str,
                 session_id: str | None = None, limits: RelayLimits | None = None) -> None:
        self.relay_url = relay_url.rstrip("/")
        self.api_key = api_key
        self.proxy_url = proxy_url.rstrip("/")
        self.proxy_key = proxy_key
        self.session_id = session_id or str(uuid.uuid4())
        """The id a relayed job is submitted with (`session_id`)."""
        self.limits = limits or RelayLimits()
        self.ready = asyncio.Event()
        """Set while connected."""
        self.connections = 0
        """Connections opened so far (reconnects included)."""
        self._inflight: dict[str, asyncio.Task[None]] = {}
        self._send_lock = asyncio.Lock()

    async def run(self) -> None:
        """Stay connected until cancelled; reconnect after a drop (Harbor refusing us ends
        it with RelayRefused)."""
        async with aiohttp.ClientSession() as http:
            async for attempt in AsyncRetrying(
                    wait=wait_exponential(multiplier=0.2, max=5.0),
                    retry=retry_if_exception_type((aiohttp.ClientError, ConnectionError,
                                                   TimeoutError))):
                with attempt:
                    await self._connected(http)
                    raise ConnectionError("the relay closed the connection")

    async def _connected(self, http: aiohttp.ClientSession) -> None:
        url = f"{self.relay_url}/connect?session_id={quote(self.session_id)}"
        headers = {"Authorization": f"Bearer {self.api_key}", "Harbor-API-Version": API_VERSION}
        try:
            socket = await http.ws_connect(url, headers=headers, heartbeat=30.0,
                                           max_msg_size=self.limits.message_bytes)
        except aiohttp.WSServerHandshakeError as exc:
            if exc.status in (401, 403, 409):
                raise RelayRefused(f"harbor relay refused the connector: {exc.status} "
                                   f"{exc.message}") from None
            raise
        self.connections += 1
        self.ready.set()
        try:
            async for message in socket:
                if message.type != aiohttp.WSMsgType.TEXT:
                    break  # closed, or an error: reconnect
                self._dispatch(socket, message.data, http)
        finally:
            self.ready.clear()
            for task in list(self._inflight.values()):
                task.cancel()  # Harbor has failed them with the connection
            await socket.close()

    def _dispatch(self, socket: aiohttp.ClientWebSocketResponse, raw: str,
                  http: aiohttp.ClientSession) -> None:
        try:
            message = json.loads(raw)
        except ValueError:
            log.warning("relay: a message that is not JSON was left out")
            return
        if not isinstance(message, dict):
            return
        if message.get("type") == "cancel":
            task = self._inflight.get(str(message.get("request_id")))
            if task is not None:
                task.cancel()
            return
        if message.get("type") != "request":
            return
        try:
            request = _Request.model_validate(message)
        except ValidationError as exc:
            request_id = message.get("request_id")
            if isinstance(request_id, str) and 0 < len(request_id) <= 200:
                self._spawn(request_id, self._send(socket, _error(
                    request_id, "invalid_request", str(exc.errors()[0]["msg"]))))
            return
        if len(self._inflight) >= self.limits.requests or request.request_id in self._inflight:
            self._spawn(f"refused-{uuid.uuid4()}", self._send(socket, _error(
                request.request_id, "overloaded", "too many relayed requests at once")))
            return
        self._spawn(request.request_id, self._forward(socket, request, http))

    def _spawn(self, request_id: str, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._inflight[request_id] = task
        task.add_done_callback(lambda _: self._inflight.pop(request_id, None))

    async def _forward(self, socket: aiohttp.ClientWebSocketResponse, request: _Request,
                       http: aiohttp.ClientSession) -> None:
        """The request through the proxy, its answer back to the relay."""
        url = (f"{self.proxy_url}/r/rollout_id/{quote(request.rollout_id, safe='')}"
               f"/request_id/{quote(request.request_id, safe='')}{request.target}")
        headers = {name: value for name, value in request.headers
                   if name.lower() in _FORWARDED}
        headers["Authorization"] = f"Bearer {self.proxy_key}"
        try:
            body = base64.b64decode(request.body_b64, validate=True)
            timeout = aiohttp.ClientTimeout(total=self.limits.forward_timeout_s)
            async with http.request(request.method, url, data=body, headers=headers,
                                    timeout=timeout) as answer:
                await self._send(socket, {
                    "type": "response_start", "request_id": request.request_id,
                    "status": answer.status, "headers": _answer_headers(answer.headers)})
                async for chunk in answer.content.iter_chunked(self.limits.chunk_bytes):
                    await self._send(socket, {
                        "type": "response_chunk", "request_id": request.request_id,
                        "body_b64": base64.b64encode(chunk).decode("ascii")})
            await self._send(socket, {"type": "response_end", "request_id": request.request_id})
        except (ValueError, aiohttp.ClientError, TimeoutError) as exc:
            with contextlib.suppress(aiohttp.ClientError, ConnectionError):
                await self._send(socket, _error(request.request_id, "proxy_error",
                                                f"{type(exc).__name__}: {exc}"[:1000]))

    async def _send(self, socket: aiohttp.ClientWebSocketResponse,
                    message: Mapping[str, Any]) -> None:
        async with self._send_lock:  # one frame at a time on the socket
            await socket.send_str(json.dumps(message))


def _answer_headers(headers: Mapping[str, str]) -> list[list[str]]:
    return [[name.lower(), value] for name, value in headers.items()
            if name.lower() in ("content-type", "cache-control")]


def _error(request_id: str, code: str, message: str) -> dict[str, str]:
    return {"type": "error", "request_id": request_id, "code": code, "message": message}
