"""`skyrl-agent tinker-serve`: a Tinker-compatible training and sampling server."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

KEY_ENV = "SKYRL_AGENT_TINKER_API_KEY"
KEY_FILE = "api-key"
"""In the data dir: the key the server made when none was given (mode 0600)."""
TENANT_KEYS = "api-keys"
"""In the data dir: one key file per named tenant (mode 0600), made on its first start."""
TENANT_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"


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
    backend: Annotated[str, typer.Option(
        help="Training backend of each model: torch (one process), fsdp (FSDP2 shards over "
             "--data-parallel ranks) or megatron (tensor parallel, no LoRA).")] = "torch",
    data_parallel: Annotated[int, typer.Option(
        min=1, help="fsdp/megatron: ranks (fsdp) or model copies (megatron) per model.")] = 1,
    tensor_parallel: Annotated[int, typer.Option(
        min=1, help="megatron: ranks each model's layers are split over.")] = 1,
    max_batch_size: Annotated[int, typer.Option(
        min=1, help="Sequences each sampler decodes together.")] = 32,
    engine: Annotated[str, typer.Option(
        help="What samples: embedded (the project's server) or vllm (bash scripts/setup.sh "
             "--vllm installs it).")] = "embedded",
    api_key: Annotated[str | None, typer.Option(
        envvar=KEY_ENV, show_envvar=True, show_default=False,
        help="The key every request must carry (starts with tml-; prefer the environment "
             "variable: a command line is visible to every user). Default: a fresh key, "
             "written to DATA_DIR/api-key (mode 0600).")] = None,
    tenant: Annotated[list[str] | None, typer.Option(
        help="A tenant of its own (repeat for several): its key is made on first start in "
             "DATA_DIR/api-keys/NAME (mode 0600). Tenants share the base models but not their "
             "training models, sessions or checkpoints (unless published); the --api-key's "
             "tenant is `default`.")] = None,
    max_lora_rank: Annotated[int, typer.Option(
        min=1, help="Per tenant: the highest LoRA rank a training model may have.")] = 64,
    max_models: Annotated[int, typer.Option(
        min=1, help="Per tenant: live training models (a model is released when its "
                    "ServiceClient closes).")] = 16,
    tenant_memory_gb: Annotated[float, typer.Option(
        min=0.001, help="Per tenant: GiB of trained state (parameters, gradients, Adam "
                        "moments; estimated from the base's weight shapes) its live training "
                        "models may hold.")] = 32.0,
) -> None:
    """Serve the Tinker API (training clients, sampling clients, checkpoints) for the tinker
    SDK: ServiceClient(base_url="http://HOST:PORT", api_key=KEY)."""
    from skyrl_agent.errors import ConfigError
    from skyrl_agent.model.names import cache_dir
    from skyrl_agent.tinker.config import (
        TINKER_KEY_PREFIX,
        BaseModels,
        ServiceOptions,
        TenantQuota,
    )

    if api_key and not api_key.startswith(TINKER_KEY_PREFIX):
        raise ConfigError(f"--api-key must start with {TINKER_KEY_PREFIX} (the tinker SDK "
                          "refuses other keys)")
    _check_backend(backend, data_parallel, tensor_parallel)
    _check_engine(engine)
    options = ServiceOptions(data_dir=data_dir or cache_dir() / "tinker",
                             models=tuple(model or ["smollm2-135m"]),
                             micro_batch_tokens=micro_batch_tokens, backend=backend,
                             data_parallel=data_parallel, tensor_parallel=tensor_parallel,
                             max_batch_size=max_batch_size, engine=engine,
                             quota=TenantQuota(max_lora_rank, max_models, tenant_memory_gb))
    BaseModels(list(options.models))  # bad names fail here, before torch is imported
    tenants = tenant or []
    for index, name in enumerate(tenants):
        if not re.fullmatch(TENANT_NAME, name) or name in ("default", *tenants[:index]):
            raise ConfigError(f"--tenant {name!r}: a new name of letters, digits, '.', '_', '-'")
    keys = {"default": api_key or _own_key(options.data_dir / KEY_FILE)}
    keys |= {name: _own_key(options.data_dir / TENANT_KEYS / name) for name in tenants}
    from skyrl_agent.tinker.server import run

    run(options, keys, host, port)


def _check_engine(engine: str) -> None:
    from skyrl_agent.errors import ConfigError

    if engine not in ("embedded", "vllm"):
        raise ConfigError(f"--engine {engine!r}: embedded or vllm")
    if engine == "vllm":
        from skyrl_agent.inference.vllm.launch import vllm_available

        if (why := vllm_available()) is not None:
            raise ConfigError(f"--engine vllm: {why}")


def _check_backend(backend: str, data_parallel: int, tensor_parallel: int) -> None:
    """The same rules as the trainer section of a run config, in one line."""
    from pydantic import ValidationError

    from skyrl_agent.config import TrainerConfig
    from skyrl_agent.errors import ConfigError

    try:
        TrainerConfig.model_validate({"backend": backend, "data_parallel": data_parallel,
                                      "tensor_parallel": tensor_parallel})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"]))
        raise ConfigError(f"--backend {backend}: {where + ': ' if where else ''}"
                          f"{first['msg'].removeprefix('Value error, ')}") from None


def _own_key(path: Path) -> str:
    """The key kept at `path` in the data dir (so clients outlive a restart), else a fresh
    one saved there, where only this user can read it. The key itself is never printed or
    logged."""
    from skyrl_agent.errors import ConfigError
    from skyrl_agent.inference.auth import KeyFileError, new_key, read_key_file, write_key_file
    from skyrl_agent.tinker.config import TINKER_KEY_PREFIX

    try:
        key = read_key_file(path)
    except KeyFileError as exc:
        raise ConfigError(str(exc)) from None
    if key is None:
        key = new_key(TINKER_KEY_PREFIX)
        write_key_file(path, key + "\n")
    typer.echo(f"API key in {path}: clients send it (TINKER_API_KEY=$(cat {path}))", err=True)
    return key
