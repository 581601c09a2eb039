"""The collector's own overhead, and end-to-end throughput with the embedded model.

1. Agent steps/s at concurrency 1, 16 and 64, in 50-step rollouts (a typical episode length):
   Terminus against a server that replies instantly (a fixed, valid reply) in a sandbox that
   does nothing. Everything else is real: LLM sessions with chat rendering, the HTTP client,
   the collector, the Parquet store. Target: >= 500 steps/s, i.e. the framework is never the
   bottleneck.
2. Rollouts/min end to end: Terminus with the embedded SmolLM2 server on demo tasks in local
   sandboxes (2 turns of 32 tokens each).

Run: .venv/bin/python benchmarks/collector.py
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import socket
import tempfile
import time
from pathlib import Path

from aiohttp import web
from transformers import AutoTokenizer

from skyrl_agent import plugins
from skyrl_agent.agents.session import LLMSession, SessionConfig
from skyrl_agent.agents.terminus import TerminusAgent
from skyrl_agent.collector.collector import Collector
from skyrl_agent.collector.run import model_sessions
from skyrl_agent.collector.store import TrajectoryStore
from skyrl_agent.config import RunConfig
from skyrl_agent.inference.client import InferenceClient
from skyrl_agent.inference.models import resolve_model
from skyrl_agent.sandboxes.base import ExecResult, Sandbox
from skyrl_agent.tasks import resolve_tasks

STEPS_PER_ROLLOUT = 50
REPLY = json.dumps({"analysis": "a", "plan": "p", "commands": [{"keystrokes": "ls\n",
                                                                  "duration": 0}],
                    "task_complete": False})


class NoopSandbox(Sandbox):
    """Answers every command at once with success and no output."""

    async def start(self) -> None:
        self._started_at = time.monotonic()

    async def exec(self, command, timeout=None, cwd=None, env=None, user=None) -> ExecResult:
        return ExecResult(0, "", "")

    async def upload(self, local, remote) -> None:
        pass

    async def download(self, remote, local) -> None:
        raise FileNotFoundError(remote)

    async def stop(self) -> None:
        pass


def _serve_instantly(reply_ids: list[int], port: int) -> None:
    """The instant-reply server, in its own process as a real model server would be."""
    body = json.dumps({"choices": [{"token_ids": reply_ids, "text": REPLY,
                                    "finish_reason": "stop", "policy_version": 0,
                                    "logprobs": {"token_logprobs": [-0.1] * len(reply_ids)}}],
                       "usage": {}})

    async def completions(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(text=body, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


def instant_server(reply_ids: list[int]) -> tuple[multiprocessing.Process, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = multiprocessing.get_context("spawn").Process(
        target=_serve_instantly, args=(reply_ids, port), daemon=True)
    process.start()
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            break
        except OSError:
            time.sleep(0.05)
    return process, f"http://127.0.0.1:{port}"


async def steps_per_second(concurrency: int, tokenizer) -> float:
    reply_ids = tokenizer.encode(REPLY, add_special_tokens=False) + [tokenizer.eos_token_id]
    server, url = instant_server(reply_ids)
    config = RunConfig(sandbox={"backend": "noop"}, agent={"max_turns": STEPS_PER_ROLLOUT},
                       collector={"max_concurrent_sandboxes": concurrency,
                                  "max_inflight_requests": concurrency})
    width = min(concurrency, 8)  # tasks x samples per task = concurrency
    tasks = resolve_tasks("demo")[:width]
    with tempfile.TemporaryDirectory() as run_dir:
        store = TrajectoryStore(Path(run_dir), writable=True)
        async with InferenceClient([url]) as client:
            def sessions(agent, session_id):
                return LLMSession(client, tokenizer, SessionConfig(max_tokens=256),
                                  tools=agent.tools, session_id=session_id)
            collector = Collector(config, TerminusAgent, store, sessions)
            started = time.perf_counter()
            results = await collector.run(tasks, concurrency // width)
            elapsed = time.perf_counter() - started
        store.close()
    server.terminate()
    steps = sum(t.num_turns for g in results for t in g.trajectories)
    return steps / elapsed


async def rollouts_per_minute(count: int) -> float:
    config = RunConfig(agent={"name": "terminus", "max_turns": 2},
                       inference={"max_tokens": 32},
                       collector={"max_concurrent_sandboxes": 4})
    tasks = resolve_tasks("demo", limit=count)
    with tempfile.TemporaryDirectory() as run_dir:
        store = TrajectoryStore(Path(run_dir), writable=True)
        async with model_sessions(config, Path(run_dir)) as sessions:
            collector = Collector(config, TerminusAgent, store, sessions)
            started = time.perf_counter()
            await collector.run(tasks, 1)
            elapsed = time.perf_counter() - started
        store.close()
    return count / elapsed * 60


def main() -> None:
    plugins.register(plugins.SANDBOXES, "noop", NoopSandbox)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))
    asyncio.run(steps_per_second(2, tokenizer))  # warm-up: first-use imports (pandas via Arrow)
    rates = {c: asyncio.run(steps_per_second(c, tokenizer)) for c in (1, 16, 64)}
    print(f"\nframework overhead: Terminus, instant replies, no-op sandbox, "
          f"{STEPS_PER_ROLLOUT} steps per rollout")
    print(f"{'concurrency':>11} {'steps/s':>9} {'vs 500 target':>14}")
    for concurrency, rate in rates.items():
        print(f"{concurrency:>11} {rate:9.0f} {rate / 500:13.2f}x")
    per_minute = asyncio.run(rollouts_per_minute(4))
    print(f"\nend to end with the embedded SmolLM2 (4 demo tasks, 2 turns x 32 tokens, "
          f"local sandboxes): {per_minute:.1f} rollouts/min")


if __name__ == "__main__":
    main()
