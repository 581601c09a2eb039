"""Reference computations for inference tests: a teacher-forced forward pass of the same weights."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def teacher_forced_logprobs(model, prompt: Sequence[int], completion: Sequence[int]) -> list[float]:
    """Logprob of each completion token given everything before it, in one unbatched pass."""
    ids = torch.tensor([list(prompt) + list(completion)])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
    start = len(prompt) - 1
    return [float(logprobs[start + i, token]) for i, token in enumerate(completion)]


def max_abs_diff(a: Sequence[float], b: Sequence[float]) -> float:
    assert len(a) == len(b), (len(a), len(b))
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)


async def generated_tokens(server) -> float:
    """Tokens a vLLM server has generated so far (its /metrics, over its socket)."""
    import aiohttp

    connector = aiohttp.UnixConnector(server.url.removeprefix("unix:"))
    async with aiohttp.ClientSession(connector=connector) as http, \
            http.get("http://localhost/metrics") as response:
        text = await response.text()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("vllm:generation_tokens_total"))


async def until_generated(server, count: float) -> None:
    """Wait (at most a minute) until `server` has generated `count` more tokens."""
    import asyncio

    start = await generated_tokens(server)
    for _ in range(1200):
        if await generated_tokens(server) >= start + count:
            return
        await asyncio.sleep(0.05)
