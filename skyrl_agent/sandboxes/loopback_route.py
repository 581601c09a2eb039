"""One host HTTP service made reachable from inside a sandbox, and nothing else of the host.

A Harbor agent that runs inside the sandbox (mini-swe-agent, the OpenHands SDK) calls its model
at the relay URL Harbor gives it, e.g. `http://127.0.0.1:P/inference/...`. The sandbox has a
network namespace of its own (no route to the host), so the host opens a listening socket
*inside* that namespace, on the same address, and serves it from here: a socket keeps the
namespace it was created in, so nothing in the sandbox joins the host's network and no process
of ours runs in the sandbox. Only requests under one path prefix are forwarded to the host's
service; every other path, and any path that climbs out of the prefix, is refused here.

Opening a socket in another process's network namespace takes CAP_SYS_ADMIN (root).
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from types import TracebackType
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from skyrl_agent.sandboxes.base import UnsupportedEnvironment

MAX_BODY_BYTES = 16 * 1024 * 1024
"""Largest request body forwarded (Harbor's relay bounds its own below this)."""
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                        "te", "trailer", "transfer-encoding", "upgrade", "host",
                        "content-length"})


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


class LoopbackRoute:
    """Serve `target` (a host URL, e.g. a relay at http://127.0.0.1:P) inside a sandbox's
    network namespace at the same host and port, for paths under `prefix` only."""

    def __init__(self, namespace: str, target: str, prefix: str) -> None:
        address = urlsplit(target)
        if address.scheme != "http" or not address.hostname or not address.port:
            raise ValueError(f"a loopback route needs an http URL with a port, not {target!r}")
        self.namespace, self.prefix = namespace, "/" + prefix.strip("/")
        self.target = f"http://{address.hostname}:{address.port}"
        self.host, self.port = address.hostname, address.port
        self.forwarded = 0
        self.refused = 0
        self._runner: web.AppRunner | None = None
        self._client: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> LoopbackRoute:
        listening = await asyncio.to_thread(listen_inside, self.namespace, self.host, self.port)
        self._client = aiohttp.ClientSession(
            auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None, sock_read=3600))
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_route("*", "/{path:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.SockSite(self._runner, listening).start()
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        trace: TracebackType | None) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._client is not None:
            await self._client.close()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        if not forwardable(request.raw_path.split("?", 1)[0], self.prefix):
            self.refused += 1
            raise web.HTTPNotFound(text="only the inference relay is reachable from here")
        assert self._client is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        self.forwarded += 1
        async with self._client.request(request.method, self.target + request.raw_path,
                                        headers=headers, data=await request.read(),
                                        allow_redirects=False) as upstream:
            response = web.StreamResponse(status=upstream.status, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP})
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response
