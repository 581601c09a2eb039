"""One host HTTP service made reachable from inside a sandbox, and nothing else of the host.

A Harbor agent that runs inside the sandbox (mini-swe-agent, the OpenHands SDK) calls its model
at the relay URL Harbor gives it, e.g. `http://127.0.0.1:P/inference/...`. The sandbox has a
network namespace of its own (no route to the host), so the host opens a listening socket
*inside* that namespace, on the same address, and serves it from here: a socket keeps the
namespace it was created in, so nothing in the sandbox joins the host's network and no process
of ours runs in the sandbox. Only requests under one path prefix are forwarded to the host's
service; every other path, and any path that climbs out of the prefix, is refused here.

Whatever runs in the sandbox may open connections here, and each one it holds costs the host
process a descriptor (and one more per request forwarded). So every route is bounded on its own
(RouteLimits): at most `connections` open at once (one more is answered 503, closed, and
reported as a violation: SkyrlEnvironment ends the sandbox for it), a connection with no
request in flight is closed after `idle_s` and any connection after `connection_s`, a request
body must arrive within `body_s` and stay within `request_bytes` (and all bodies held at once
within `buffered_bytes`), heads within aiohttp's line, field and header-count limits. Across
routes, none accepts while the process has HEADROOM descriptors or fewer left
(descriptors.py): new connections wait in the kernel's backlog, and the host keeps what it
needs to start and stop sandboxes.

Opening a socket in another process's network namespace takes CAP_SYS_ADMIN (root).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from skyrl_agent.descriptors import HEADROOM, descriptors_left, prepare, spent
from skyrl_agent.sandboxes.base import UnsupportedEnvironment

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 16 * 1024 * 1024
"""Largest request body forwarded (Harbor's relay bounds its own below this)."""
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                        "te", "trailer", "transfer-encoding", "upgrade", "host",
                        "content-length"})
HEADROOM_POLL_S = 0.2
"""How often a route that stopped accepting for want of descriptors looks again."""
COUNT_EVERY_S = 0.5
"""How old a count of the process's descriptors may be when a route accepts (accepts since
are subtracted from it): counting costs ~2 ms per 1,000 open."""


@dataclass(frozen=True)
class RouteLimits:
    """What one sandbox may hold of its route (so of the host process)."""

    connections: int = 32
    """Connections open at once; an agent calling its model needs a few."""
    idle_s: float = 60.0
    """A connection with no request in flight for this long is closed (keep-alive clients
    reconnect; httpx drops its own idle ones after 5 s)."""
    connection_s: float = 3600.0
    """Any connection is closed this long after it was accepted (Harbor's relay gives one
    model call at most 1800 s)."""
    body_s: float = 30.0
    """A request's body must have arrived this long after its head."""
    request_bytes: int = MAX_BODY_BYTES
    """One request body."""
    buffered_bytes: int = 2 * MAX_BODY_BYTES
    """Request bodies held at once, over all the route's connections."""
    line_bytes: int = 8190
    """The request line, and each header line."""
    headers: int = 64
    """Header lines of one request."""


def listen_inside(namespace: str, host: str, port: int) -> socket.socket:
    """A listening TCP socket bound to host:port in the network namespace `namespace` (a /proc
    path). The switch happens on a thread of its own that ends afterwards, so no thread of this
    process is left in the sandbox's namespace even if switching back failed."""
    if os.geteuid() != 0:
        raise UnsupportedEnvironment("reaching a host service from a sandbox needs root "
                                     "(a socket in the sandbox's network namespace)")
    made: list[socket.socket] = []
    failed: list[BaseException] = []

    def bind() -> None:
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(namespace, os.O_RDONLY)
        try:
            os.setns(target, os.CLONE_NEWNET)
            try:
                made.append(socket.create_server((host, port)))
            finally:
                os.setns(own, os.CLONE_NEWNET)
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            failed.append(exc)
        finally:
            os.close(own)
            os.close(target)

    thread = threading.Thread(target=bind, name="loopback-route-bind")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    made[0].setblocking(False)
    return made[0]


def forwardable(path: str, prefix: str) -> bool:
    """Whether a request path lies under `prefix` without climbing out of it."""
    segments = path.split("/")
    if any(s in (".", "..") or "%" in s for s in segments):
        return False  # no dot segments, no encoded ones a server might decode into them
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


@dataclass(eq=False)
class _Connection:
    """One accepted connection, as the route's watchdog sees it."""

    accepted_at: float
    last_active: float
    transport: asyncio.Transport | None = None
    active: int = 0
    """Requests being served on it."""


class _Tracked(asyncio.Protocol):
    """aiohttp's handler of one connection, which also tells the route when it ends (aiohttp's
    handler takes no attributes of ours)."""

    def __init__(self, handler: asyncio.Protocol, made: Callable[[asyncio.BaseTransport], None],
                 ended: Callable[[], None]) -> None:
        self._handler, self._made, self._ended = handler, made, ended

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._made(transport)
        self._handler.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._handler.data_received(data)

    def eof_received(self) -> bool | None:
        return self._handler.eof_received()

    def pause_writing(self) -> None:
        self._handler.pause_writing()

    def resume_writing(self) -> None:
        self._handler.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            self._handler.connection_lost(exc)
        finally:
            self._ended()


class LoopbackRoute:
    """Serve `target` (a host URL, e.g. a relay at http://127.0.0.1:P) inside a sandbox's
    network namespace at the same host and port, for paths under `prefix` only, within
    `limits`; `on_violation` hears (once) that the sandbox tried to pass them."""

    def __init__(self, namespace: str, target: str, prefix: str,
                 limits: RouteLimits | None = None,
                 on_violation: Callable[[str], None] | None = None) -> None:
        address = urlsplit(target)
        if address.scheme != "http" or not address.hostname or not address.port:
            raise ValueError(f"a loopback route needs an http URL with a port, not {target!r}")
        self.namespace, self.prefix = namespace, "/" + prefix.strip("/")
        self.target = f"http://{address.hostname}:{address.port}"
        self.host, self.port = address.hostname, address.port
        self.limits = limits or RouteLimits()
        self.on_violation = on_violation
        self.violation: str | None = None
        """Why the sandbox passed the limits (the first time), for `on_violation`."""
        self.forwarded = 0
        self.refused = 0
        """Requests for paths outside the prefix."""
        self.accepted = 0
        self.turned_away = 0
        """Connections past `limits.connections`, answered 503 and closed."""
        self.closed_idle = 0
        self.closed_expired = 0
        self.too_large = 0
        self.peak = 0
        """The most connections open at once."""
        self._open: dict[_Connection, None] = {}
        self._by_transport: dict[asyncio.BaseTransport, _Connection] = {}
        self._buffered = 0
        self._listening: socket.socket | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._runner: web.AppRunner | None = None
        self._client: aiohttp.ClientSession | None = None

    @property
    def open_connections(self) -> int:
        return len(self._open)

    async def __aenter__(self) -> LoopbackRoute:
        prepare()
        limits = self.limits
        self._listening = await asyncio.to_thread(listen_inside, self.namespace, self.host,
                                                  self.port)
        # At most one upstream connection per connection of the sandbox's.
        self._client = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=limits.connections),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_read=limits.connection_s))
        app = web.Application(client_max_size=limits.request_bytes)
        app.router.add_route("*", "/{path:.*}", self._forward)
        # handler_cancellation: a connection the watchdog closes ends its forward too.
        self._runner = web.AppRunner(
            app, access_log=None, handler_cancellation=True, shutdown_timeout=2.0,
            auto_decompress=False, keepalive_timeout=limits.idle_s,
            max_line_size=limits.line_bytes, max_field_size=limits.line_bytes,
            max_headers=limits.headers)
        await self._runner.setup()
        self._tasks = [asyncio.create_task(self._accept()), asyncio.create_task(self._watch())]
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        trace: TracebackType | None) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._listening is not None:
            self._listening.close()
        if self._runner is not None:
            await self._runner.cleanup()
        for connection in list(self._open):  # any the handler's shutdown did not close
            if connection.transport is not None:
                connection.transport.abort()
        if self._client is not None:
            await self._client.close()

    # ---- connections --------------------------------------------------------------------------

    async def _accept(self) -> None:
        assert self._listening is not None and self._runner is not None
        loop = asyncio.get_running_loop()
        while True:
            if descriptors_left(COUNT_EVERY_S) <= HEADROOM:  # the host's own work first
                await asyncio.sleep(HEADROOM_POLL_S)
                continue
            try:
                sock, _ = await loop.sock_accept(self._listening)
            except OSError as exc:  # e.g. out of descriptors after all: look again shortly
                log.warning("loopback route %s: accept failed: %s", self.port, exc)
                await asyncio.sleep(HEADROOM_POLL_S)
                continue
            spent(2)  # the connection, and the forward it may open
            if len(self._open) >= self.limits.connections:
                self._turn_away(sock)
                continue
            await self._serve(loop, sock)

    async def _serve(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        assert self._runner is not None and self._runner.server is not None
        now = time.monotonic()
        connection = _Connection(accepted_at=now, last_active=now)
        self._open[connection] = None
        self.accepted += 1
        self.peak = max(self.peak, len(self._open))
        server = self._runner.server

        def made(transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.Transport)  # a socket's
            connection.transport = transport
            self._by_transport[transport] = connection

        def ended() -> None:
            self._open.pop(connection, None)
            if connection.transport is not None:
                self._by_transport.pop(connection.transport, None)

        try:
            await loop.connect_accepted_socket(lambda: _Tracked(server(), made, ended), sock)
        except OSError:
            ended()
            sock.close()

    def _turn_away(self, sock: socket.socket) -> None:
        """One connection past the cap: a 503 line if the socket takes it, closed, reported."""
        self.turned_away += 1
        cap = self.limits.connections
        message = f"more than {cap} connections at once from this sandbox\n".encode()
        with contextlib.suppress(OSError):
            sock.setblocking(False)
            sock.send(b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n"
                      b"Content-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s"
                      % (len(message), message))
        sock.close()
        self._violated(f"it opened more than {cap} connections at once to the host "
                       "(loopback route)")

    def _violated(self, why: str) -> None:
        if self.violation is not None:
            return
        self.violation = why
        log.warning("loopback route %s: %s", self.port, why)
        if self.on_violation is not None:
            try:
                self.on_violation(why)
            except Exception as exc:  # noqa: BLE001 - the route keeps its limits regardless
                log.warning("loopback route %s: ending the sandbox failed: %s", self.port, exc)

    async def _watch(self) -> None:
        """Close connections idle past `idle_s` (no request in flight) and any connection past
        `connection_s`."""
        limits = self.limits
        interval = min(1.0, limits.idle_s / 4, limits.connection_s / 4)
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for connection in list(self._open):
                transport = connection.transport
                if transport is None or transport.is_closing():
                    continue
                if now - connection.accepted_at > limits.connection_s:
                    self.closed_expired += 1
                    transport.abort()
                elif connection.active == 0 and now - connection.last_active > limits.idle_s:
                    self.closed_idle += 1
                    transport.close()

    # ---- requests -----------------------------------------------------------------------------

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        if not forwardable(request.raw_path.split("?", 1)[0], self.prefix):
            self.refused += 1
            raise web.HTTPNotFound(text="only the inference relay is reachable from here")
        connection = self._by_transport.get(request.transport) if request.transport else None
        if connection is not None:
            connection.active += 1
        held = 0
        try:
            body = bytearray()
            try:
                async with asyncio.timeout(self.limits.body_s):
                    async for chunk in request.content.iter_any():
                        held += len(chunk)
                        self._buffered += len(chunk)
                        if held > self.limits.request_bytes or \
                                self._buffered > self.limits.buffered_bytes:
                            self.too_large += 1
                            raise web.HTTPRequestEntityTooLarge(
                                max_size=self.limits.request_bytes, actual_size=held,
                                text="request body too large for the loopback route")
                        body += chunk
            except TimeoutError:
                raise web.HTTPRequestTimeout(text="the request body did not arrive in "
                                                  f"{self.limits.body_s:g} s") from None
            return await self._relay(request, bytes(body))
        finally:
            self._buffered -= held
            if connection is not None:
                connection.active -= 1
                connection.last_active = time.monotonic()

    async def _relay(self, request: web.Request, body: bytes) -> web.StreamResponse:
        assert self._client is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        self.forwarded += 1
        async with self._client.request(request.method, self.target + request.raw_path,
                                        headers=headers, data=body,
                                        allow_redirects=False) as upstream:
            response = web.StreamResponse(status=upstream.status, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP})
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response
