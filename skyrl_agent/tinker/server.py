"""Starting the Tinker server: bind, announce the URL, serve until SIGTERM or SIGINT.

Once the socket is bound, one JSON line `{"event": "ready", "url": ...}` goes to stdout (the
embedded server's convention), so a parent can pass port 0 and learn the real port.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal

from skyrl_agent.tinker.config import ServiceOptions


async def serve(options: ServiceOptions, host: str = "127.0.0.1", port: int = 8000) -> None:
    from aiohttp import web

    from skyrl_agent.tinker.app import TinkerApp
    from skyrl_agent.tinker.proto import public_pb

    public_pb()  # fail at start-up, with the extra's name, when the SDK is missing
    from skyrl_agent.tinker.service import TinkerService

    service = TinkerService(options)
    runner = web.AppRunner(TinkerApp(service).app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    print(json.dumps({"event": "ready", "url": f"http://{host}:{bound}"}), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def run(options: ServiceOptions, host: str = "127.0.0.1", port: int = 8000) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("aiohttp").setLevel(logging.WARNING)
    asyncio.run(serve(options, host, port))
