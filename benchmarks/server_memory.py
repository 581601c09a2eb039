"""The embedded server's memory under load: 64 concurrent agent-like sessions (a long first
prompt, then turns that extend it by the completion and a few new tokens, the shape the prefix
cache is for), the server's resident memory sampled throughout. The bound the server keeps:
peak RSS <= weights + its KV budget (`inference.kv_cache_mb`) + 1 GB.

Run: .venv/bin/python benchmarks/server_memory.py [SESSIONS] [KV_CACHE_MB]
Writes benchmarks/results/server_memory.md.
"""

from __future__ import annotations

import asyncio
import random
import sys
import threading
import time
from pathlib import Path

from skyrl_agent.inference.client import InferenceClient, Sampling
from skyrl_agent.inference.process import embedded_server

MODEL = "smollm2-135m"
WEIGHTS_MB = 134.5e6 * 4 / 2**20  # SmolLM2-135M in float32, lm_head tied to the embedding
FIXED_OVERHEAD_MB = 1024
FIRST_PROMPT_TOKENS = 700
TURNS = 3
NEW_TOKENS_PER_TURN = 40
MAX_TOKENS = 48
RESULTS = Path(__file__).parent / "results" / "server_memory.md"


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for pid {pid}")


async def session(client: InferenceClient, index: int) -> int:
    rng = random.Random(index)
    prompt = [rng.randrange(100, 40000) for _ in range(FIRST_PROMPT_TOKENS)]
    sampling = Sampling(max_tokens=MAX_TOKENS, ignore_eos=True)
    cached = 0
    for _ in range(TURNS):
        out = await client.complete(prompt, sampling, session_id=f"s{index}")
        cached += out.cached_prompt_tokens or 0
        prompt = prompt + list(out.token_ids) + [rng.randrange(100, 40000)
                                                  for _ in range(NEW_TOKENS_PER_TURN)]
    return cached


def main() -> None:
    sessions = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    kv_mb = int(sys.argv[2]) if len(sys.argv) > 2 else None
    server = embedded_server(MODEL, **({} if kv_mb is None else {"kv_cache_mb": kv_mb}))
    url = server.start()
    try:
        pid = server.pid
        idle = rss_mb(pid)
        peak = [idle]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.1):
                peak[0] = max(peak[0], rss_mb(pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()

        async def load() -> tuple[float, int]:
            async with InferenceClient([url]) as client:
                started = time.perf_counter()
                cached = await asyncio.gather(*[session(client, i) for i in range(sessions)])
                return time.perf_counter() - started, sum(cached)

        elapsed, cached = asyncio.run(load())
        done.set()
        sampler.join()
        peak_mb = max(peak[0], rss_mb(pid, "VmHWM"))
        budget_mb = server_kv_budget_mb(kv_mb)
    finally:
        server.stop()
    bound = WEIGHTS_MB + budget_mb + FIXED_OVERHEAD_MB
    verdict = "within" if peak_mb <= bound else "OVER"
    lines = [
        "# Embedded server memory under load",
        "",
        f"`benchmarks/server_memory.py {sessions}{'' if kv_mb is None else f' {kv_mb}'}`: "
        f"{sessions} concurrent sessions of {TURNS} turns ({FIRST_PROMPT_TOKENS}-token first "
        f"prompt, +{MAX_TOKENS} sampled +{NEW_TOKENS_PER_TURN} new tokens a turn), {MODEL} "
        "float32, one server.",
        "",
        "| weights MB | KV budget MB | RSS idle MB | RSS peak MB | bound MB (weights + KV + "
        "1024) | peak vs bound | prefix-cache hit tokens | seconds |",
        "|---|---|---|---|---|---|---|---|",
        f"| {WEIGHTS_MB:.0f} | {budget_mb:.0f} | {idle:.0f} | {peak_mb:.0f} | {bound:.0f} | "
        f"{verdict} | {cached} | {elapsed:.0f} |",
        "",
    ]
    RESULTS.write_text("\n".join(lines))
    print("\n".join(lines))


def server_kv_budget_mb(kv_mb: int | None) -> float:
    if kv_mb is not None:
        return kv_mb
    from skyrl_agent.inference.server.main import ServeOptions
    return ServeOptions().kv_cache_mb


if __name__ == "__main__":
    main()
