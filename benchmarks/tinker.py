"""The Tinker protocol's overhead: forward_backward + optim_step through the real SDK and
`tinker-serve`, against the same backend called directly in this process.

For each model, the same LoRA training (rank 16, cross_entropy on every token, Adam) runs
two ways, step by step in turn (a, b, a, b, ...) so that both see the same load on a shared
machine, and never at the same time:
  (a) in-process: `TorchBackend.forward_backward` then `optim_step`, in a spawned process of
      its own with nothing else in it, timed there;
  (b) through the SDK: `TrainingClient.forward_backward` then `optim_step` (submitted before
      the first finishes, as the cookbook does), waiting for both results each step.
A second row per model times an optimizer step alone with learning rate 0 (no gradient to
apply): the bare round trip. Each row is the median over STEPS steps of each after WARMUP
warm-up steps of each;
ratio = (b)/(a) is the protocol's cost per step (HTTP, protobuf both ways, futures and
long-poll, the server's worker thread). Models: SmolLM2-135M (the default; compute
dominates) and a tiny random Llama over a character vocabulary (the per-call overhead alone).

Run: .venv/bin/python benchmarks/tinker.py [--only tiny]   (minutes on 2 cores)
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from skyrl_agent.backends.backend import AdamParams, Datum
from skyrl_agent.backends.torch_backend import TorchBackend
from skyrl_agent.inference.process import ServerProcess
from skyrl_agent.model.loading import LoraSettings
from skyrl_agent.model.names import resolve_model

WARMUP, STEPS, RANK, LR = 1, 5, 16, 1e-4
SHAPES = {"smollm2-135m": (4, 64), "tiny": (8, 32)}
"""Sequences per batch and tokens per sequence."""


def batch(vocab: int, rows: int, length: int) -> list[list[int]]:
    rng = np.random.default_rng(0)
    return [rng.integers(10, vocab, size=length + 1).tolist() for _ in range(rows)]


def medians(step_a: Callable[[], float], step_b: Callable[[], float]) -> tuple[float, float]:
    """Median seconds of each step, run alternately; a step returns its own seconds."""
    for _ in range(WARMUP):
        step_a()
        step_b()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(STEPS):
        times[0].append(step_a())
        times[1].append(step_b())
    return statistics.median(times[0]), statistics.median(times[1])


def _backend_worker(folder: Path, sequences: list[list[int]], commands: Any) -> None:
    """The in-process side, in a process of its own: a process that also runs the SDK's
    client threads slows a CPU-bound torch loop down (measured 2-3x on the tiny model), which
    would credit the protocol with a speed-up it does not have."""
    backend = TorchBackend(folder, lora=LoraSettings(rank=RANK), seed=0)
    data = [Datum(tuple(s[:-1]), {"target_tokens": tuple(s[1:]),
                                  "weights": (1.0,) * (len(s) - 1)}) for s in sequences]
    while (command := commands.recv()) != "quit":
        started = time.perf_counter()
        if command == "step":
            backend.forward_backward(data, "cross_entropy")
        backend.optim_step(AdamParams(learning_rate=LR if command == "step" else 0.0))
        commands.send(time.perf_counter() - started)
    backend.close()


def in_process(folder: Path, sequences: list[list[int]],
               ) -> tuple[Callable[[], float], Callable[[], float], Callable[[], None]]:
    """(a): TorchBackend's step and optimizer step alone, timed inside a spawned process."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    worker = context.Process(target=_backend_worker, args=(folder, sequences, theirs))
    worker.start()

    def run(command: str) -> float:
        ours.send(command)
        return float(ours.recv())

    def stop() -> None:
        ours.send("quit")
        worker.join()

    return (lambda: run("step")), (lambda: run("optim")), stop


def through_sdk(url: str, name: str, sequences: list[list[int]],
                ) -> tuple[Callable[[], float], Callable[[], float]]:
    """The SDK's training step, and an optimizer step alone (a protocol round trip)."""
    import tinker
    from tinker import types

    service = tinker.ServiceClient(base_url=url, api_key="tml-bench")
    client = service.create_lora_training_client(base_model=name, rank=RANK).result()
    data = [types.Datum(model_input=types.ModelInput.from_ints(s[:-1]),
                        loss_fn_inputs={"target_tokens": np.asarray(s[1:], dtype=np.int64),
                                        "weights": np.ones(len(s) - 1, dtype=np.float32)})
            for s in sequences]

    def step() -> float:
        started = time.perf_counter()
        fwd_bwd = client.forward_backward(data, "cross_entropy")
        optim = client.optim_step(types.AdamParams(learning_rate=LR))
        fwd_bwd.result()
        optim.result()
        return time.perf_counter() - started

    def optim_only() -> float:
        started = time.perf_counter()
        client.optim_step(types.AdamParams(learning_rate=0.0)).result()
        return time.perf_counter() - started

    return step, optim_only


def main() -> None:
    import argparse

    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(SHAPES), help="Measure one model only.")
    only = parser.parse_args().only

    # This file's own folder would shadow the `tinker` package: the repository goes there.
    sys.path[0] = str(Path(__file__).resolve().parents[1])
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    from tests.tiny_models import char_model_dir

    work = Path(tempfile.mkdtemp(prefix="skyrl-bench-tinker-"))
    folders = {"smollm2-135m": resolve_model("smollm2-135m"),
               "tiny": char_model_dir(work / "tiny", hidden=32, layers=1)}
    folders = {k: v for k, v in folders.items() if only in (None, k)}
    cli = str(Path(sys.executable).parent / "skyrl-agent")
    argv = [cli, "tinker-serve", "--port", "0", "--data-dir", str(work / "data")]
    for name, folder in folders.items():
        argv += ["--model", f"{name}={folder}"]
    server = ServerProcess(argv, log_path=work / "server.log", startup_timeout_s=300)
    server.start()
    print(f"torch threads {torch.get_num_threads()}, cores {os.cpu_count()}, "
          f"load {os.getloadavg()[0]:.1f} at the start")
    print("| model | batch | (a) in-process s/step | (b) SDK s/step | (b)/(a) | "
          "SDK overhead ms/step | load |")
    print("|---|---|---:|---:|---:|---:|---:|")
    try:
        for name, folder in folders.items():
            rows, length = SHAPES[name]
            vocab = int(__import__("json").loads((folder / "config.json").read_text())
                        ["vocab_size"])
            sequences = batch(vocab, rows, length)
            direct_step, direct_optim, stop = in_process(folder, sequences)
            sdk_step, sdk_optim = through_sdk(server.url or "", name, sequences)
            rows_out = [(f"{rows}x{length}", *medians(direct_step, sdk_step)),
                        ("optim_step alone", *medians(direct_optim, sdk_optim))]
            stop()
            for label, direct, sdk in rows_out:
                print(f"| {name} | {label} | {direct:.4f} | {sdk:.4f} | "
                      f"**{sdk / direct:.2f}** | {1000 * (sdk - direct):.1f} | "
                      f"{os.getloadavg()[0]:.1f} |", flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
