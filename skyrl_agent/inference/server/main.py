"""Starting the embedded server: load the model, start the engine, serve HTTP until stopped.

`python -m skyrl_agent.inference.server` and `skyrl-agent serve` both land here. Once the socket
is bound, one JSON line `{"event": "ready", "url": ...}` goes to stdout so a parent process can
use port 0 and learn the real port.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from skyrl_agent.errors import ConfigError

if TYPE_CHECKING:
    from aiohttp import web


@dataclass(frozen=True)
class ServeOptions:
    """How to run one embedded server."""

    model: str = "smollm2-135m"
    """A built-in model name or a local Hugging Face folder."""
    host: str = "127.0.0.1"
    port: int = 8000
    """0 picks a free port (announced on stdout)."""
    served_model_name: str | None = None
    """The name clients send as `model`; defaults to `model` (or the folder name)."""
    max_batch_size: int = 32
    kv_cache_mb: float = 1024
    """KV memory budget: the running batch and the prefix cache together."""
    max_model_len: int | None = None
    """Context length; defaults to the model's."""
    dtype: str = "float32"
    policy_version: int = 0
    """Version of the weights at start (a resumed run passes its checkpoint's)."""
    api_key: str | None = field(default=None, repr=False)
    """Protects every route but /health; None leaves generation open and control off (unless
    the starting run set SKYRL_AGENT_CONTROL_KEY)."""
    weights_dirs: tuple[str, ...] = ()
    """Folders whose .safetensors files /update_weights may load, beside the trainer's
    shared-memory files."""
    max_sequences_per_request: int = 256
    max_prompt_chars: int = 1 << 20


def load_engine(options: ServeOptions):
    import torch
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from skyrl_agent.inference.server.engine import Engine
    from skyrl_agent.model.names import resolve_model
    from skyrl_agent.model.vision import ImageInputs, load_pretrained, text_config
    from skyrl_agent.model.weights.folders import WeightsFolders
    from skyrl_agent.model.weights.reader import WeightLoader

    hf_logging.disable_progress_bar()  # a server log is not a terminal
    folder = resolve_model(options.model)
    dtype = getattr(torch, options.dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise ConfigError(f"unknown dtype {options.dtype!r} (try float32 or bfloat16)")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = load_pretrained(folder, dtype)
    if torch.cuda.is_available():
        model = model.cuda()
    else:
        # Loaded weights may still be backed by the file's mapping; the first in-place weight
        # update would then page-fault through all of it (measured 10x slower). Own them now.
        with torch.no_grad():
            for param in model.parameters():
                param.data = param.data.clone()
    context = text_config(model.config).max_position_embeddings
    if options.max_model_len and options.max_model_len > context:
        raise ConfigError(f"max_model_len {options.max_model_len} exceeds the model's {context}")
    engine = Engine(model, tokenizer, max_batch_size=options.max_batch_size,
                    max_model_len=options.max_model_len, kv_cache_mb=options.kv_cache_mb,
                    policy_version=options.policy_version,
                    weights=WeightLoader(WeightsFolders.with_extra(options.weights_dirs)),
                    images=ImageInputs.for_model(folder))
    return engine, tokenizer


def served_name(options: ServeOptions) -> str:
    if options.served_model_name:
        return options.served_model_name
    path = Path(options.model)
    return path.name if path.is_dir() else options.model


async def serve_until_stopped(app: web.Application, host: str, port: int) -> None:
    """Serve `app` on host:port until SIGTERM or SIGINT, printing the ready line once bound."""
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        bound = runner.addresses[0][1]
        print(json.dumps({"event": "ready", "url": f"http://{host}:{bound}"}), flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()


async def serve(options: ServeOptions) -> None:
    from skyrl_agent.inference.auth import CONTROL_KEY_ENV
    from skyrl_agent.inference.server.app import EmbeddedServer
    from skyrl_agent.inference.server.protocol import RequestLimits

    control_key = os.environ.pop(CONTROL_KEY_ENV, None) or None
    limits = RequestLimits(options.max_sequences_per_request, options.max_prompt_chars)
    engine, tokenizer = await asyncio.to_thread(load_engine, options)
    engine.start()
    try:
        server = EmbeddedServer(engine, tokenizer, served_name(options), api_key=options.api_key,
                                control_key=control_key, limits=limits)
        await serve_until_stopped(server.app(), options.host, options.port)
    finally:
        engine.close()


def run(options: ServeOptions) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    asyncio.run(serve(options))
