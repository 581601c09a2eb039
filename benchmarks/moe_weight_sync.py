"""MoE weight updates: only the experts that moved, beside whole updates, in one run.

A random Qwen3-MoE (4 layers, 64 experts, top-2, hidden 128; 51 MB of float32 weights, 95% of it
in experts) is trained by the torch backend on small batches (2 sequences of 16 tokens a step),
and after every step the same weights file goes to two embedded servers side by side: one gets
the update with its list of changed tensors and expert rows, the other loads the whole file.
Per step: bytes each copies and the server-side seconds (the pause sampling sees), and at the end
both servers sample the same tokens with the same logprobs.

Under AdamW an expert's weights move from the first step it receives a token on (its first
moment stays non-zero after that), so the moved share grows with the experts used so far; with
weight decay every tensor moves and updates are whole.

Run: .venv/bin/python benchmarks/moe_weight_sync.py   (about a minute on 2 cores; writes
benchmarks/results/moe_weight_sync.md)
"""

from __future__ import annotations

import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path

from skyrl_agent.backends.backend import AdamParams, Datum
from skyrl_agent.backends.torch_backend import TorchBackend
from skyrl_agent.inference.client import InferenceClient, Sampling
from skyrl_agent.inference.process import embedded_server
from tests.tiny_models import char_moe_dir

RESULTS = Path(__file__).parent / "results" / "moe_weight_sync.md"
STEPS = 8
MB = 1e6


def batch(step: int) -> list[Datum]:
    rng = random.Random(step)
    data = []
    for _ in range(2):
        sequence = [rng.randrange(8, 100) for _ in range(17)]
        data.append(Datum(tuple(sequence[:-1]), {
            "target_tokens": tuple(sequence[1:]), "weights": (1.0,) * 16,
            "advantages": (rng.choice((-1.0, 1.0)),) * 16, "logprobs": (-4.6,) * 16}))
    return data


async def run(model: Path) -> tuple[list[dict[str, float]], bool]:
    backend = TorchBackend(model, dtype="float32")
    with embedded_server(str(model)) as delta, embedded_server(str(model)) as whole:
        async with InferenceClient([delta.url], api_keys=[delta.api_key]) as to_delta, \
                InferenceClient([whole.url], api_keys=[whole.api_key]) as to_whole:
            rows = []
            for step in range(1, STEPS + 1):
                backend.forward_backward(batch(step), "importance_sampling")
                backend.optim_step(AdamParams(learning_rate=1e-3))
                update = backend.save_weights_for_sampler(step)
                [delta_s] = await to_delta.update_weights(str(update.path), step, update.changed)
                [whole_s] = await to_whole.update_weights(str(update.path), step)
                assert backend._shared is not None
                rows.append({"step": step, "delta_mb": update.nbytes / MB,
                             "whole_mb": backend._shared.nbytes / MB, "delta_s": delta_s,
                             "whole_s": whole_s})
            prompt = list(range(10, 40))
            a = await to_delta.complete(prompt, Sampling(max_tokens=32, seed=1))
            b = await to_whole.complete(prompt, Sampling(max_tokens=32, seed=1))
    backend.close()
    return rows, a.token_ids == b.token_ids and a.logprobs == b.logprobs


def write(rows: list[dict[str, float]], same: bool, seconds: float) -> None:
    later = rows[1:]  # the first update is whole on both
    lines = ["# MoE weight updates: moved experts only vs whole", "",
             f"Command: `.venv/bin/python benchmarks/moe_weight_sync.py` (this run: "
             f"{seconds:.0f} s on 2 cores). Random Qwen3-MoE, 4 layers, 64 experts, top-2, "
             "hidden 128, float32; torch backend, AdamW without weight decay, 2 x 16 tokens a "
             "step. Seconds: the server's copy, during which sampling is paused.", "",
             "| step | delta MB | whole MB | delta s | whole s |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['step']} | {r['delta_mb']:.1f} | {r['whole_mb']:.1f} "
                     f"| {r['delta_s']:.4f} | {r['whole_s']:.4f} |")
    bytes_ratio = statistics.median(r["delta_mb"] / r["whole_mb"] for r in later)
    time_ratio = statistics.median(r["delta_s"] / r["whole_s"] for r in later)
    lines += ["", f"Steps 2-{STEPS}, median: the delta moves {bytes_ratio:.2f} of the bytes and "
              f"pauses sampling {time_ratio:.2f} as long as a whole update. Both servers then "
              f"sample {'the same tokens with the same logprobs' if same else 'DIFFERENTLY'}."]
    RESULTS.write_text("\n".join(lines) + "\n")


def main() -> None:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="moe-sync-") as tmp:
        model = char_moe_dir(Path(tmp) / "model", hidden=128, layers=4, experts=64, top_k=2)
        rows, same = asyncio.run(run(model))
    write(rows, same, time.monotonic() - started)
    print(RESULTS.read_text())
    if not same:
        raise SystemExit("the servers disagree: a delta update lost a change")


if __name__ == "__main__":
    main()
