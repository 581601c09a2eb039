"""Launching vLLM (extra `gpu`) so the same InferenceClient drives it.

What the client needs from vLLM, and the switch that gives it:
- token-id prompts, sampled `token_ids`, per-token logprobs: built into `/v1/completions`
  (`return_token_ids`, `logprobs`), nothing to enable;
- `/pause?mode=keep|wait|abort`, `/resume`, `/is_paused` and the native weight-transfer routes
  (`/init_weight_transfer_engine`, `/start_weight_update`, `/update_weights`,
  `/finish_weight_update`): `VLLM_SERVER_DEV_MODE=1` plus `--weight-transfer-config`;
- prefix caching for sticky sessions: `--enable-prefix-caching`.

The CPU path never imports this module's heavy parts: vLLM is only looked up when launched.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

from skyrl_agent.errors import UserError
from skyrl_agent.inference.auth import new_key
from skyrl_agent.inference.process import ServerProcess


@dataclass(frozen=True)
class VLLMOptions:
    """How to start one `vllm serve`."""

    model: str
    """A local model folder (no hub access at run time)."""
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int | None = None
    """None picks a free port."""
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.85
    dtype: str = "bfloat16"
    weight_transfer_backend: str = "nccl"
    """`nccl` (trainer on other GPUs) or `ipc` (trainer on the same GPU)."""
    tensor_parallel_size: int = 1
    extra_args: tuple[str, ...] = ()


def vllm_available() -> str | None:
    """Why vLLM cannot run here, or None when it can."""
    if shutil.which("vllm") is None:
        return "vllm is not installed (pip install 'skyrl-agent[gpu]')"
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible"
    return None


def vllm_command(options: VLLMOptions, port: int) -> list[str]:
    argv = ["vllm", "serve", options.model, "--host", options.host, "--port", str(port),
            "--dtype", options.dtype, "--enable-prefix-caching",
            "--gpu-memory-utilization", str(options.gpu_memory_utilization),
            "--tensor-parallel-size", str(options.tensor_parallel_size),
            "--weight-transfer-config", json.dumps({"backend": options.weight_transfer_backend})]
    if options.served_model_name:
        argv += ["--served-model-name", options.served_model_name]
    if options.max_model_len:
        argv += ["--max-model-len", str(options.max_model_len)]
    return argv + list(options.extra_args)


def vllm_server(options: VLLMOptions, log_path: Path | None = None) -> ServerProcess:
    """A ServerProcess for `vllm serve`; ready when /health answers."""
    reason = vllm_available()
    if reason:
        raise UserError(f"cannot start vLLM: {reason}")
    if not Path(options.model).is_dir():
        raise UserError(f"vLLM needs a local model folder, not {options.model!r}")
    port = options.port or _free_port(options.host)
    # vLLM's own key option, through its environment (a command line is readable by any user):
    # its OpenAI routes need it. Its dev-mode control routes are reached on options.host only.
    key = new_key()
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "HF_HUB_OFFLINE": "1",
           "VLLM_API_KEY": key}
    return ServerProcess(vllm_command(options, port), env=env, log_path=log_path,
                         url=f"http://{options.host}:{port}", startup_timeout_s=900.0,
                         api_key=key)


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
