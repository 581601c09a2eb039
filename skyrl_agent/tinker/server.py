"""Starting the Tinker server: bind, announce the URL, serve until SIGTERM or SIGINT.

Once the socket is bound, one JSON line `{"event": "ready", "url": ...}` goes to stdout
(`serve_until_stopped`, shared with the embedded server), so a parent can pass port 0 and learn
the real port.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from skyrl_agent.tinker.config import ServiceOptions


async def serve(options: ServiceOptions, keys: Mapping[str, str], host: str = "127.0.0.1",
                port: int = 8000) -> None:
    """Serve until stopped; `keys`: each tenant's API key."""
    from skyrl_agent.inference.server.main import serve_until_stopped
    from skyrl_agent.model.weights.files import remove_orphans
    from skyrl_agent.tinker.app import TinkerApp
    from skyrl_agent.tinker.proto import public_pb

    public_pb()  # fail at start-up, with the extra's name, when the SDK is missing
    from skyrl_agent.tinker.service import TinkerService

    # A server restarted after a kill frees the shared memory its predecessor's trainers held
    # (otherwise held until some trainer here publishes weights).
    remove_orphans()

    await serve_until_stopped(TinkerApp(TinkerService(options), keys).app(), host, port)


def run(options: ServiceOptions, keys: Mapping[str, str], host: str = "127.0.0.1",
        port: int = 8000) -> None:
    server_logging()
    asyncio.run(serve(options, keys, host, port))


def server_logging() -> None:
    """The server's own info messages on stderr; libraries' warnings only (torch's compiler
    logs pages of INFO lines, at exit too, and aiohttp one per request)."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("skyrl_agent").setLevel(logging.INFO)
