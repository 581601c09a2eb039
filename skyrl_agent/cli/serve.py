"""`skyrl-agent serve`: the embedded CPU model server."""

from __future__ import annotations

from pathlib import Path
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
    kv_cache_mb: Annotated[float, typer.Option(
        min=1, help="KV cache memory budget in MB (running batch + prefix cache); requests "
                    "beyond it wait.")] = 1024,
    max_model_len: Annotated[int | None, typer.Option(min=16, help="Context length cap.")] = None,
    dtype: Annotated[str, typer.Option(help="Weights dtype: float32 or bfloat16.")] = "float32",
    api_key: Annotated[str | None, typer.Option(
        envvar="SKYRL_AGENT_API_KEY", show_envvar=True, show_default=False,
        help="Require `Authorization: Bearer KEY` on every route but /health (prefer the "
             "environment variable: a command line is visible to every user). Without it, "
             "generation is open and pause / resume / update_weights are off.")] = None,
    weights_dir: Annotated[list[Path] | None, typer.Option(
        help="A folder whose .safetensors files update_weights may load (repeatable); the "
             "trainer's shared-memory weight files are always allowed.")] = None,
    max_sequences_per_request: Annotated[int, typer.Option(
        min=1, help="Most prompts x n in one request.")] = 256,
    max_prompt_chars: Annotated[int, typer.Option(
        min=1, help="Most characters of text tokenized for one prompt.")] = 1 << 20,
) -> None:
    """Serve a model over HTTP with vLLM's OpenAI-compatible API (the embedded CPU server)."""
    from skyrl_agent.inference.server.main import ServeOptions, run
    run(ServeOptions(model=model, host=host, port=port, served_model_name=served_model_name,
                     max_batch_size=max_batch_size, kv_cache_mb=kv_cache_mb,
                     max_model_len=max_model_len, dtype=dtype,
                     api_key=api_key or None,
                     weights_dirs=tuple(str(d) for d in weights_dir or ()),
                     max_sequences_per_request=max_sequences_per_request,
                     max_prompt_chars=max_prompt_chars))
