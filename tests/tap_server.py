"""A recording pass-through in front of a model server: what the server received and sampled.

Tests put it between the capture proxy and the embedded server, so "the stored ids are the ids
the server sampled" is checked against the server's own replies, not against the recorder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web


@dataclass
class TapServer:
    upstream: str
    calls: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)
    """(request body, response body) of every /v1/completions call, in order."""
    url: str = ""

    def sampled(self) -> list[tuple[list[int], list[int], list[float]]]:
        """Per call: the prompt ids received, the ids sampled and their logprobs."""
        out = []
        for request, response in self.calls:
            choice = response["choices"][0]
            out.append((request["prompt"], choice["token_ids"],
                        choice["logprobs"]["token_logprobs"]))
        return out

    async def _forward(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        async with self._http.request(request.method, self.upstream + request.path,
                                      json=body, headers=_session_header(request)) as reply:
            data = await reply.json(content_type=None)
            if request.path == "/v1/completions" and reply.status == 200:
                self.calls.append((body, data))
            return web.json_response(data, status=reply.status)

    async def __aenter__(self) -> TapServer:
        self._http = aiohttp.ClientSession()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._runner.cleanup()
        await self._http.close()


def _session_header(request: web.Request) -> dict[str, str]:
    return {k: v for k, v in request.headers.items() if k.lower() == "x-session-id"}
