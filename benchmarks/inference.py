"""Embedded server throughput and weight-update cost, measured side by side in one run.

1. Tokens/s at concurrency 1, 4 and 16: a server that batches (max batch 32) against the same
   server decoding one sequence at a time (max batch 1). Same model, prompts and token counts.
2. A full weight update (trainer writes safetensors to shared memory, server loads and copies)
   against a plain in-memory copy of the same tensors.

Run: .venv/bin/python benchmarks/inference.py [MAX_TOKENS]
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from skyrl_agent.inference.client import InferenceClient, Sampling
from skyrl_agent.inference.process import embedded_server
from skyrl_agent.model.names import resolve_model

CONCURRENCY = (1, 4, 16)


async def tokens_per_second(url: str, concurrency: int, max_tokens: int) -> float:
    sampling = Sampling(max_tokens=max_tokens, ignore_eos=True)
    async with InferenceClient([url]) as client:
        await client.complete([1, 2, 3], Sampling(max_tokens=2))  # warm-up
        started = time.perf_counter()
        outs = await asyncio.gather(*[
            client.complete([1, 9690, 198, 2683 + i, 359, 253], sampling)
            for i in range(concurrency)])
        elapsed = time.perf_counter() - started
    return sum(len(o.token_ids) for o in outs) / elapsed


async def weight_update(url: str) -> tuple[float, float]:
    model = AutoModelForCausalLM.from_pretrained(resolve_model("smollm2-135m"))
    state = {k: v.contiguous() for k, v in model.state_dict().items()
             if k != "lm_head.weight"}  # tied to the embedding
    # One stat of a local tmpfs before anything is timed: blocking here costs nothing.
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None  # noqa: ASYNC240
    with tempfile.TemporaryDirectory(dir=shm) as folder:
        path = os.path.join(folder, "policy.safetensors")
        write_started = time.perf_counter()
        save_file(state, path)
        write_s = time.perf_counter() - write_started
        update_times = []
        async with InferenceClient([url]) as client:
            for version in (1, 2, 3):
                save_file(state, path)  # a fresh file each time, as a trainer writes it
                started = time.perf_counter()
                await client.update_weights(path, version)
                update_times.append(time.perf_counter() - started)
        update_s = sorted(update_times)[1]
    targets = {k: torch.zeros_like(v) for k, v in state.items()}  # touched: no page faults timed
    copy_times = []
    for _ in range(3):
        started = time.perf_counter()
        for name, tensor in state.items():
            targets[name].copy_(tensor)
        copy_times.append(time.perf_counter() - started)
    copy_s = min(copy_times)
    params = sum(v.numel() for v in state.values()) / 1e6
    print(f"  trainer writes the file: {write_s:.3f} s ({params:.0f}M params)")
    return update_s, copy_s


def main() -> None:
    max_tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    batched = embedded_server(max_batch_size=32)
    sequential = embedded_server(max_batch_size=1)
    rows = []
    with batched, sequential:
        for concurrency in CONCURRENCY:
            # Best of two, alternating servers, so machine noise hits both sides alike.
            with_batching = one_by_one = 0.0
            for _ in range(2):
                with_batching = max(with_batching, asyncio.run(
                    tokens_per_second(batched.url, concurrency, max_tokens)))
                one_by_one = max(one_by_one, asyncio.run(
                    tokens_per_second(sequential.url, concurrency, max_tokens)))
            rows.append((concurrency, with_batching, one_by_one))
            print(f"  concurrency {concurrency}: done")
        update_s, copy_s = asyncio.run(weight_update(batched.url))
    print(f"\nSmolLM2-135M on CPU, {max_tokens} tokens per request")
    print(f"{'concurrency':>11} {'batched tok/s':>14} {'sequential tok/s':>17} {'ratio':>6}")
    for concurrency, with_batching, one_by_one in rows:
        print(f"{concurrency:>11} {with_batching:14.1f} {one_by_one:17.1f} "
              f"{with_batching / one_by_one:5.1f}x")
    print(f"\nweight update (HTTP + mmap + copy, median of 3): {update_s:.3f} s; "
          f"plain memory copy: {copy_s:.3f} s; ratio {update_s / copy_s:.1f}x")


if __name__ == "__main__":
    main()
