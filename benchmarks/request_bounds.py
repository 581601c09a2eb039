"""A victim's latency beside an attacker whose requests sit at every request bound.

The attack (issue 54): one /v1/completions with 2.5 M stop_token_ids or 300,000 stop strings,
checked after every sampled token, took a concurrent 8-token request from ~1 s to 5-11 s. The
server now refuses those past the bounds (skyrl_agent/inference/bounds.py). Measured here on
the embedded server with SmolLM2-135M: the victim's 8-token greedy request, one at a time,
  alone
  beside a plain attacker   one connection sending back-to-back 64-token requests
  beside the attacker at the bounds   the same requests with 16 stop strings of 256
                            characters, 64 stop_token_ids and 20 logprobs per token
  beside the attacker past the bounds   the issue's 2.5 M stop_token_ids, each refused (what
                            refusing costs: the body is still read and parsed)
  beside n at its bound     the same with n=64: the engine holds 16 of its rows at once (half
                            the batch), as 16 concurrent requests would (volume, not a field's
                            cost)
The aim: the attacker at the bounds within 1.5x of alone. The last two rows are volume, not a
field's per-token cost, and no field bound can bring them there.

Run: .venv/bin/python benchmarks/request_bounds.py [ROUNDS] [REQUESTS_PER_ROUND]
Writes benchmarks/results/request_bounds.md (not part of CI).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from skyrl_agent.inference.bounds import (
    MAX_LOGPROBS,
    MAX_N,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
)
from skyrl_agent.inference.process import embedded_server

RESULTS = Path(__file__).parent / "results" / "request_bounds.md"
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
VICTIM = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
PLAIN = {"prompt": PROMPT, "max_tokens": 64, "ignore_eos": True}
AT_BOUNDS = {
    **PLAIN,
    # Strings the model never writes, so none ends a request early.
    "stop": [chr(0x4E00 + i) * MAX_STOP_CHARS for i in range(MAX_STOP_STRINGS)],
    "stop_token_ids": list(range(49000, 49000 + MAX_STOP_TOKEN_IDS)),
    "logprobs": MAX_LOGPROBS,
}
PAST_BOUNDS = {**PLAIN, "stop_token_ids": [49000] * 2_500_000}
"""The attack of issue 54 (a 15 MB body): refused now, at the price of reading it."""
SCENARIOS: list[tuple[str, dict[str, Any] | None]] = [
    ("alone", None),
    ("beside a plain attacker", PLAIN),
    ("beside the attacker at the bounds", AT_BOUNDS),
    ("beside the attacker past the bounds (each refused)", PAST_BOUNDS),
    ("beside n at its bound (batch share)", {**AT_BOUNDS, "n": MAX_N}),
]


async def post(http: aiohttp.ClientSession, url: str, body: bytes, refused: bool = False) -> int:
    async with http.post(
        f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    ) as reply:
        if reply.status != (400 if refused else 200):
            raise RuntimeError(f"HTTP {reply.status}: {await reply.text()}")
        await reply.read()
        return reply.status


async def attack(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], stop: asyncio.Event
) -> int:
    data = json.dumps(body).encode()  # once: the client's own encoding is not the server's cost
    sent = 0
    while not stop.is_set():
        await post(http, url, data, refused=body is PAST_BOUNDS)
        sent += 1
    return sent


async def scenario(url: str, attacker: dict[str, Any] | None, requests: int) -> list[float]:
    async with aiohttp.ClientSession() as http:
        stop = asyncio.Event()
        task = asyncio.create_task(attack(http, url, attacker, stop)) if attacker else None
        await asyncio.sleep(1.0 if attacker else 0)  # the attacker's rows are in the batch
        latencies = []
        for _ in range(requests):
            started = time.perf_counter()
            await post(http, url, json.dumps(VICTIM).encode())
            latencies.append(time.perf_counter() - started)
        stop.set()
        if task is not None:
            await task
    return latencies


async def main(rounds: int, per_round: int) -> None:
    """Rounds of every scenario in turn, so load from elsewhere on the machine falls on each
    alike; n at its bound last (its attacker holds the batch for long)."""
    measured: dict[str, list[float]] = {name: [] for name, _ in SCENARIOS}
    with embedded_server("smollm2-135m") as server:
        await scenario(server.url, None, 3)  # warm-up
        async with aiohttp.ClientSession() as http:
            past = await post(http, server.url, json.dumps(PAST_BOUNDS).encode(), refused=True)
        for _ in range(rounds):
            for name, attacker in SCENARIOS[:-1]:
                measured[name] += await scenario(server.url, attacker, per_round)
        name, attacker = SCENARIOS[-1]
        measured[name] += await scenario(server.url, attacker, per_round)
    alone = statistics.median(measured["alone"])
    rows = []
    for name, latencies in measured.items():
        median = statistics.median(latencies)
        rows.append(
            f"| {name} | {len(latencies)} | {median:.3f} | {max(latencies):.3f} | "
            f"{median / alone:.2f}x |"
        )
        print(rows[-1], flush=True)
    table = "\n".join(
        [
            "| victim's 8-token request | requests | median s | max s | median / alone |",
            "|---|---|---|---|---|",
            *rows,
        ]
    )
    RESULTS.write_text(
        "# A request beside one at every request bound\n\n"
        f"`benchmarks/request_bounds.py {rounds} {per_round}`: the embedded server "
        "(SmolLM2-135M, float32, CPU), the victim's 8-token greedy request sent one at a time, "
        f"{rounds} rounds of {per_round} per scenario, scenarios in turn. The attacker at the "
        f"bounds: {MAX_STOP_STRINGS} stop strings of {MAX_STOP_CHARS} characters, "
        f"{MAX_STOP_TOKEN_IDS} stop_token_ids and {MAX_LOGPROBS} logprobs per token, 64 tokens "
        "per request, back to back on one connection. Before the bounds, one request with "
        "2.5 M stop_token_ids or 300,000 stop strings took this request from ~1 s to 5-11 s "
        f"(issue 54); that request now gets HTTP {past}, but sent back to back it still costs "
        "the server its 17.5 MB body: parsing holds the interpreter lock the engine thread "
        "needs between its torch calls. `n` at its bound asks for 64 rows; the engine holds at "
        "most half its batch (16 rows) of one request at once, so the victim joins at once and "
        "decodes in a batch of 17 rows, as beside 16 concurrent requests.\n\n" + table + "\n"
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:3]]
    asyncio.run(main(*args) if args else main(3, 5))
