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
    engine: Annotated[str, typer.Option(
        help="embedded (this project's server, on --host/--port) or vllm (bash "
             "scripts/setup.sh --vllm installs it; on a Unix socket only this user can open, "
             "since its control routes answer without a key: the `unix:` URL printed on stdout "
             "is what --endpoint takes).")] = "embedded",
) -> None:
    """Serve a model over HTTP with vLLM's OpenAI-compatible API (the embedded CPU server, or
    vLLM itself)."""
    if engine == "vllm":
        _serve_vllm(model, served_model_name, kv_cache_mb, max_model_len, dtype, api_key,
                    weights_dir or [])
        return
    if engine != "embedded":
        from skyrl_agent.errors import ConfigError

        raise ConfigError(f"--engine {engine!r}: embedded or vllm")
    from skyrl_agent.inference.server.main import ServeOptions, run
    run(ServeOptions(model=model, host=host, port=port, served_model_name=served_model_name,
                     max_batch_size=max_batch_size, kv_cache_mb=kv_cache_mb,
                     max_model_len=max_model_len, dtype=dtype,
                     api_key=api_key or None,
                     weights_dirs=tuple(str(d) for d in weights_dir or ()),
                     max_sequences_per_request=max_sequences_per_request,
                     max_prompt_chars=max_prompt_chars))


def _serve_vllm(model: str, served_model_name: str | None, kv_cache_mb: float,
                max_model_len: int | None, dtype: str, api_key: str | None,
                weights_dirs: list[Path]) -> None:
    """vLLM on its private socket until Ctrl-C or SIGTERM; its URL on stdout."""
    import signal
    import threading

    from skyrl_agent.inference.vllm.launch import VLLMOptions, vllm_server
    from skyrl_agent.model.names import resolve_model

    options = VLLMOptions(model=str(resolve_model(model)),
                          served_model_name=served_model_name or model,
                          max_model_len=max_model_len, dtype=dtype, kv_cache_mb=kv_cache_mb,
                          weight_folders=tuple(weights_dirs))
    server = vllm_server(options, api_key=api_key)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        print(server.start(), flush=True)
        if not api_key:
            print("its key: SKYRL_AGENT_API_KEY=" + str(server.api_key), flush=True)
        while server.running and not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
