"""The Tinker protocol's overhead: forward_backward + optim_step through the real SDK and
`tinker-serve`, against the same backend called directly in this process.

For each model, the same LoRA training (rank 16, cross_entropy on every token, Adam) runs
twice, one after the other so they never share the cores:
  (a) in-process: `TorchBackend.forward_backward` then `optim_step`;
  (b) through the SDK: `TrainingClient.forward_backward` then `optim_step` (submitted before
      the first finishes, as the cookbook does), waiting for both results each step.
Each row is the median step time over STEPS steps after WARMUP warm-up steps; ratio = (b)/(a)
is the protocol's cost per step (HTTP, protobuf both ways, futures and long-poll, the server's
worker thread). Models: SmolLM2-135M (the default; compute dominates) and a tiny random Llama
over a character vocabulary (the per-call overhead alone).

Run: .venv/bin/python benchmarks/tinker.py   (a few minutes on 2 cores)
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TINKER_TELEMETRY", "0")

from skyrl_agent.inference.models import resolve_model
from skyrl_agent.inference.process import ServerProcess
from skyrl_agent.trainers.backend import AdamParams, Datum
from skyrl_agent.trainers.torch_backend import TorchBackend
from skyrl_agent.trainers.torch_model import LoraSettings
from tests.tiny_models import char_model_dir

WARMUP, STEPS, RANK, LR = 2, 8, 16, 1e-4
SHAPES = {"smollm2-135m": (8, 128), "tiny": (8, 32)}
"""Sequences per batch and tokens per sequence."""


def batch(vocab: int, rows: int, length: int) -> list[list[int]]:
    rng = np.random.default_rng(0)
    return [rng.integers(10, vocab, size=length + 1).tolist() for _ in range(rows)]


def median_step(step: Callable[[], None]) -> float:
    for _ in range(WARMUP):
        step()
    times = []
    for _ in range(STEPS):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def in_process(folder: Path, sequences: list[list[int]]) -> float:
    backend = TorchBackend(folder, lora=LoraSettings(rank=RANK), seed=0)
    data = [Datum(tuple(s[:-1]), {"target_tokens": tuple(map(float, s[1:])),
                                  "weights": (1.0,) * (len(s) - 1)}) for s in sequences]

    def step() -> None:
        backend.forward_backward(data, "cross_entropy")
        backend.optim_step(AdamParams(learning_rate=LR))

    try:
        return median_step(step)
    finally:
        backend.close()


def through_sdk(url: str, name: str, sequences: list[list[int]]) -> float:
    import tinker
    from tinker import types

    service = tinker.ServiceClient(base_url=url, api_key="tml-bench")
    client = service.create_lora_training_client(base_model=name, rank=RANK).result()
    data = [types.Datum(model_input=types.ModelInput.from_ints(s[:-1]),
                        loss_fn_inputs={"target_tokens": np.asarray(s[1:], dtype=np.int64),
                                        "weights": np.ones(len(s) - 1, dtype=np.float32)})
            for s in sequences]

    def step() -> None:
        fwd_bwd = client.forward_backward(data, "cross_entropy")
        optim = client.optim_step(types.AdamParams(learning_rate=LR))
        fwd_bwd.result()
        optim.result()

    return median_step(step)


def main() -> None:
    import torch

    work = Path(tempfile.mkdtemp(prefix="skyrl-bench-tinker-"))
    folders = {"smollm2-135m": resolve_model("smollm2-135m"),
               "tiny": char_model_dir(work / "tiny", hidden=32, layers=1)}
    cli = str(Path(sys.executable).parent / "skyrl-agent")
    argv = [cli, "tinker-serve", "--port", "0", "--data-dir", str(work / "data")]
    for name, folder in folders.items():
        argv += ["--model", f"{name}={folder}"]
    server = ServerProcess(argv, log_path=work / "server.log", startup_timeout_s=300)
    server.start()
    print(f"torch threads {torch.get_num_threads()}, cores {os.cpu_count()}, "
          f"load {os.getloadavg()[0]:.1f}")
    print("| model | batch | (a) in-process s/step | (b) SDK s/step | (b)/(a) | "
          "SDK overhead ms/step |")
    print("|---|---|---:|---:|---:|---:|")
    try:
        for name, folder in folders.items():
            rows, length = SHAPES[name]
            vocab = int(__import__("json").loads((folder / "config.json").read_text())
                        ["vocab_size"])
            sequences = batch(vocab, rows, length)
            direct = in_process(folder, sequences)
            sdk = through_sdk(server.url or "", name, sequences)
            print(f"| {name} | {rows}x{length} | {direct:.4f} | {sdk:.4f} | "
                  f"**{sdk / direct:.2f}** | {1000 * (sdk - direct):.1f} |", flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
