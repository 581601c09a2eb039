"""The capture proxy: overhead per call, and what re-tokenizing would have trained on.

Both measured on the same calls, side by side in one run, with the openai SDK as the agent:
- a multi-turn conversation is sent through the capture proxy (token ids to the embedded
  server's /v1/completions); a tap in front of the server records what it received and sampled;
- the very same message lists are then sent straight to the server's /v1/chat/completions (the
  server renders and tokenizes them itself, as a re-tokenizing gateway would).

Printed: median latency per call of each path and their ratio; the proxy alone against an
instant-reply server (its own cost in ms); and, over the captured calls, the tokens a
re-tokenizing gateway would differ on against the ids the server actually sampled, with ours
(recorded ids vs the tap's) beside it, which must be 0.

    .venv/bin/python benchmarks/capture.py [--model smollm2-135m] [--conversations 4]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import sys
import time
from pathlib import Path

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.tap_server

import aiohttp
import openai
from transformers import AutoTokenizer

from skyrl_agent.capture import CaptureProxy
from skyrl_agent.inference.client import InferenceClient
from skyrl_agent.inference.process import embedded_server
from skyrl_agent.llm.session import LLMSession, SessionConfig
from skyrl_agent.model.names import resolve_model
from tests.tap_server import TapServer

TURNS = 8
MAX_TOKENS = 24
OBSERVATION = ("total 12\n-rw-r--r-- 1 root root  120 notes.txt\n"
               "-rw-r--r-- 1 root root 4096 data.csv\n")


async def conversation(agent: openai.AsyncOpenAI, seed: int) -> tuple[list, list[float]]:
    """One conversation through `agent`: the message list of each call and its latency."""
    messages: list[dict] = [{"role": "system", "content": "You are a shell assistant."},
                            {"role": "user", "content": f"Task {seed}: look at the files."}]
    sent, latencies = [], []
    for turn in range(TURNS):
        sent.append(list(messages))
        started = time.perf_counter()
        reply = await agent.chat.completions.create(model="m", messages=messages,
                                                    max_tokens=MAX_TOKENS, seed=seed + turn)
        latencies.append(time.perf_counter() - started)
        messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                     {"role": "user", "content": f"Output {turn}:\n{OBSERVATION}"}]
    return sent, latencies


async def direct(url: str, calls: list[list[dict]], model: str) -> list[float]:
    """The same calls straight to the server's chat endpoint."""
    latencies = []
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as agent:
        for index, messages in enumerate(calls):
            started = time.perf_counter()
            await agent.chat.completions.create(model=model, messages=messages,
                                                max_tokens=MAX_TOKENS, seed=index)
            latencies.append(time.perf_counter() - started)
    return latencies


async def captured(url: str, tokenizer, conversations: int):
    """Conversations through the proxy; per-call latencies, the calls, mismatch counts."""
    async with (TapServer(url) as tap, InferenceClient([tap.url]) as client,
                CaptureProxy() as proxy):
        calls, latencies, sessions = [], [], []
        for seed in range(conversations):
            llm = LLMSession(client, tokenizer, SessionConfig(max_tokens=MAX_TOKENS), seed=seed)
            handle = proxy.open(llm)
            async with openai.AsyncOpenAI(base_url=handle.base_url, api_key="x",
                                          max_retries=0) as agent:
                sent, took = await conversation(agent, seed * 100)
            calls += sent
            latencies += took
            sessions.append((llm, handle.session))
    recorded = sorted((list(t.prompt_ids), list(t.completion_ids))
                      for llm, _ in sessions for s in llm.segments for t in s.turns)
    sampled = sorted((p, c) for p, c, _ in tap.sampled())
    ours = sum(a != b for a, b in zip(recorded, sampled, strict=True))
    theirs = sum(session.retokenization()[0] for _, session in sessions)
    bad_segments = sum(session.retokenization()[1] for _, session in sessions)
    tokens = sum(len(p) + len(c) for p, c in sampled)
    return latencies, calls, ours, theirs, bad_segments, tokens


async def instant_server() -> tuple[web.AppRunner, str]:
    """A server that answers every completion at once with 8 fixed ids."""
    async def complete(request: web.Request) -> web.Response:
        await request.json()
        choice = {"text": "ok", "token_ids": [28, 29, 30, 31, 32, 33, 34, 2],
                  "finish_reason": "stop", "logprobs": {"token_logprobs": [-0.5] * 8}}
        return web.json_response({"choices": [choice], "usage": {}})

    app = web.Application()
    app.router.add_post("/v1/completions", complete)
    runner = web.AppRunner(app)
    await runner.setup()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


async def proxy_alone(tokenizer, calls: list[list[dict]]) -> tuple[float, float]:
    """Median ms per call against an instant server: through the proxy (plain HTTP posts, so
    no client library's own cost is counted), and bare InferenceClient calls on the same ids."""
    runner, url = await instant_server()
    try:
        async with (InferenceClient([url]) as client, CaptureProxy() as proxy,
                    aiohttp.ClientSession() as http):
            llm = LLMSession(client, tokenizer, SessionConfig(max_tokens=MAX_TOKENS))
            handle = proxy.open(llm)
            through = []
            for messages in calls:
                body = {"model": "m", "messages": messages, "max_tokens": MAX_TOKENS}
                started = time.perf_counter()
                async with http.post(f"{handle.base_url}/chat/completions", json=body) as reply:
                    await reply.json()
                through.append(time.perf_counter() - started)
            from skyrl_agent.inference.client import Sampling

            bare = []
            for turn in llm.segments[-1].turns:
                started = time.perf_counter()
                await client.complete(turn.prompt_ids, Sampling(max_tokens=MAX_TOKENS))
                bare.append(time.perf_counter() - started)
    finally:
        await runner.cleanup()
    return statistics.median(through) * 1e3, statistics.median(bare) * 1e3


async def main(model: str, conversations: int) -> None:
    folder = resolve_model(model)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    with embedded_server(model) as server:
        served = Path(model).name if folder.name != model else model
        await captured(server.url, tokenizer, 1)  # warm-up: imports, prefix cache, first calls
        via_proxy, calls, ours, theirs, bad_calls, tokens = await captured(
            server.url, tokenizer, conversations)
        straight = await direct(server.url, calls, served)
    alone, bare = await proxy_alone(tokenizer, calls)
    proxy_ms, direct_ms = statistics.median(via_proxy) * 1e3, statistics.median(straight) * 1e3
    print(f"model {model}, {conversations} conversations x {TURNS} turns x {MAX_TOKENS} tokens")
    print("| path | median ms/call |")
    print("|------|---------------:|")
    print(f"| openai SDK -> server /v1/chat/completions | {direct_ms:.1f} |")
    print(f"| openai SDK -> capture proxy -> server /v1/completions | {proxy_ms:.1f} |")
    print(f"| ratio proxy / direct | {proxy_ms / direct_ms:.3f} |")
    print(f"| instant server through the proxy (plain HTTP) | {alone:.2f} |")
    print(f"| instant server, bare InferenceClient.complete | {bare:.2f} |")
    print(f"re-tokenizing gateway: {theirs} tokens differ in {bad_calls} of {conversations} "
          f"segments ({tokens} tokens sent and sampled over {len(calls)} calls); captured vs "
          f"sampled: {ours} calls differ")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--conversations", type=int, default=4)
    args = parser.parse_args()
    asyncio.run(main(args.model, args.conversations))
