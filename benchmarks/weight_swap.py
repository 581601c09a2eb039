"""What a weight update costs the sampler: the embedded server stages the next weights into its
back buffers while it keeps decoding, then swaps them in between two decode steps. Per model,
N full updates from a shared-memory safetensors file while 4 sequences decode; the server
reports the staging (transfer) and the swap (the only time decoding waits: the
inference-visible pause). SmolLM2-135M beside a random model about 4x its size (same
tokenizer; hidden and MLP widths doubled, 34 layers).

Targets: pause <= 5 ms for SmolLM2-135M, and within 2x of that for the 4x model.
Run: .venv/bin/python benchmarks/weight_swap.py [N]   Writes benchmarks/results/weight_swap.md.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from skyrl_agent.inference.client import InferenceClient, Sampling
from skyrl_agent.inference.process import embedded_server
from skyrl_agent.model.names import resolve_model

RESULTS = Path(__file__).parent / "results" / "weight_swap.md"
SHM = Path("/dev/shm") if Path("/dev/shm").is_dir() else None


def larger_model(folder: Path) -> int:
    """A random model about 4x SmolLM2-135M in `folder`; its parameter count."""
    base = resolve_model("smollm2-135m")
    config = AutoConfig.from_pretrained(base)
    config.hidden_size *= 2
    config.intermediate_size *= 2
    config.num_hidden_layers = 34
    config.head_dim = config.hidden_size // config.num_attention_heads
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(base).save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def weights_file(model_dir: str, folder: Path) -> Path:
    """The model's weights, slightly changed, as the trainer would publish them."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    state = {k: (v + 1e-3).contiguous() for k, v in model.state_dict().items()
             if k != "lm_head.weight"}  # tied to the embedding
    path = folder / "policy.safetensors"
    save_file(state, path)
    return path


async def updates(url: str, key: str | None, path: Path, count: int) -> list[tuple[float, float]]:
    """(transfer s, pause s) of each update, made while 4 sequences decode."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    times = []
    async with InferenceClient([url]) as client, aiohttp.ClientSession(headers=headers) as http:
        decoding = [asyncio.create_task(client.complete([1, 9690, 198, 2683 + i],
                                                        Sampling(max_tokens=100_000 // 200,
                                                                 ignore_eos=True)))
                    for i in range(4)]
        await asyncio.sleep(2.0)  # decoding is under way
        for version in range(1, count + 1):
            async with http.post(f"{url}/update_weights",
                                 json={"path": str(path), "version": version}) as response:
                reply = await response.json()
            pause = reply["pause_seconds"]
            times.append((reply["seconds"] - pause, pause))
            await asyncio.sleep(0.2)
        for task in decoding:
            task.cancel()
        await asyncio.gather(*decoding, return_exceptions=True)
    return times


def measure(model_dir: str, count: int, scratch: Path) -> tuple[float, float, float]:
    path = weights_file(model_dir, scratch)
    server = embedded_server(model_dir, weights_dirs=[scratch])
    url = server.start()
    try:
        times = asyncio.run(updates(url, server.api_key, path, count))
    finally:
        server.stop()
        path.unlink()
    transfers, pauses = zip(*times, strict=True)
    return statistics.median(transfers), statistics.median(pauses), max(pauses)


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    rows = []
    with tempfile.TemporaryDirectory() as models, \
            tempfile.TemporaryDirectory(dir=SHM) as scratch:
        big = Path(models) / "random-4x"
        params = larger_model(big)
        for name, folder, size in [("smollm2-135m", resolve_model("smollm2-135m"), 134.5e6),
                                   ("random 4x", big, params)]:
            started = time.perf_counter()
            transfer, pause, worst = measure(str(folder), count, Path(scratch))
            rows.append(f"| {name} | {size / 1e6:.0f} M | {transfer * 1e3:.0f} | "
                        f"{pause * 1e3:.2f} | {worst * 1e3:.2f} | "
                        f"{time.perf_counter() - started:.0f} |")
    lines = ["# Weight swap: transfer vs the pause decoding sees", "",
             f"`benchmarks/weight_swap.py {count}`: {count} full float32 updates per model from "
             "a shared-memory file while 4 sequences decode; medians (and the worst pause). "
             "Before double buffers the pause was the whole transfer.", "",
             "| model | parameters | transfer ms | pause ms | worst pause ms | seconds |",
             "|---|---|---|---|---|---|", *rows, ""]
    RESULTS.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
