"""`skyrl-agent tinker-serve`: a Tinker-compatible training and sampling server."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def tinker_serve(
    model: Annotated[list[str] | None, typer.Option(
        help="Base model (default smollm2-135m): a built-in name, a local Hugging Face folder, "
             "or NAME=FOLDER to serve "
             "a folder under the name clients ask for (e.g. Qwen/Qwen3-8B=./tiny). Repeat for "
             "several.")] = None,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port; 0 picks a free one (printed on stdout).")]
        = 8000,
    data_dir: Annotated[Path | None, typer.Option(
        help="Checkpoints and sampling sessions (default: the project cache's tinker/).")]
        = None,
    micro_batch_tokens: Annotated[int, typer.Option(
        min=16, help="Padded tokens per micro-batch of forward_backward.")] = 2048,
    max_batch_size: Annotated[int, typer.Option(
        min=1, help="Sequences each sampler decodes together.")] = 32,
) -> None:
    """Serve the Tinker API (training clients, sampling clients, checkpoints) for the tinker
    SDK: ServiceClient(base_url="http://HOST:PORT", api_key="tml-...")."""
    from skyrl_agent.inference.models import cache_dir
    from skyrl_agent.tinker.config import BaseModels, ServiceOptions

    options = ServiceOptions(data_dir=data_dir or cache_dir() / "tinker",
                             models=tuple(model or ["smollm2-135m"]),
                             micro_batch_tokens=micro_batch_tokens,
                             max_batch_size=max_batch_size)
    BaseModels(list(options.models))  # bad names fail here, before torch is imported
    from skyrl_agent.tinker.server import run

    run(options, host, port)
