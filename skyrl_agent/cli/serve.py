"""`skyrl-agent serve`: the embedded CPU model server."""

from __future__ import annotations

from typing import Annotated

import typer


def serve(
    model: Annotated[str, typer.Option(help="Built-in model name or local Hugging Face folder.")]
        = "smollm2-135m",
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port; 0 picks a free one (printed on stdout).")] = 8000,
    served_model_name: Annotated[str | None, typer.Option(
        help="Name clients send as `model` (default: --model).")] = None,
    max_batch_size: Annotated[int, typer.Option(min=1, help="Most sequences decoded together.")]
        = 32,
    max_model_len: Annotated[int | None, typer.Option(min=16, help="Context length cap.")] = None,
    dtype: Annotated[str, typer.Option(help="Weights dtype: float32 or bfloat16.")] = "float32",
) -> None:
    """Serve a model over HTTP with vLLM's OpenAI-compatible API (the embedded CPU server)."""
    from skyrl_agent.inference.server.main import ServeOptions, run
    run(ServeOptions(model=model, host=host, port=port, served_model_name=served_model_name,
                     max_batch_size=max_batch_size, max_model_len=max_model_len, dtype=dtype))
