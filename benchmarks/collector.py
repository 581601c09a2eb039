"""The collector's own overhead against a floor measured in the same run; end-to-end throughput.

1. Agent steps/s at concurrency 1, 16 and 64, in 50-step rollouts (a typical episode length):
   Terminus against a server that replies instantly (a fixed, valid reply) in a sandbox that
   runs nothing (every command succeeds at once and prints a prompt; verification finds no
   reward file, so every reward is a failed 0: only speed counts here). Everything else is
   real: LLM sessions with chat rendering, the HTTP client, the collector, the Parquet store.
2. The floor at each concurrency: as many bare `InferenceClient.complete` calls as the agents
   made steps, at the same concurrency, to the same server, with prompts of the agents' mean
   prompt length (the head of one of their prompts: real ids, as costly to send), and no
   session, agent, sandbox or store. An absolute steps/s says little on a
   noisy 2-core machine; the fraction steps/s / floor requests/s is what the framework keeps of
   what the client and server allow. Target: >= 0.5 at concurrency 16.
3. Rollouts/min end to end: Terminus with the embedded SmolLM2 server on demo tasks in local
   sandboxes (2 turns of 32 tokens each).

Run: .venv/bin/python benchmarks/collector.py [RUNS]   (a few minutes on 2 cores; default 3 runs)
Writes benchmarks/results/collector.md.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import socket
import sys
import tempfile
import time
from multiprocessing.process import BaseProcess
from pathlib import Path

from aiohttp import web
from transformers import AutoTokenizer

from skyrl_agent import plugins
from skyrl_agent.agents.terminus import TerminusAgent
from skyrl_agent.collector.collector import Collector
from skyrl_agent.collector.model_access import model_sessions
from skyrl_agent.config import RunConfig
from skyrl_agent.data.store import TrajectoryStore
from skyrl_agent.inference.client import InferenceClient, Sampling
from skyrl_agent.llm.session import LLMSession, SessionConfig
from skyrl_agent.model.names import resolve_model
from skyrl_agent.sandboxes.base import FILE_READ_LIMIT, ExecResult, Sandbox
from skyrl_agent.tasks import resolve_tasks

STEPS_PER_ROLLOUT = 50
MAX_TOKENS = 256
RESULTS = Path(__file__).parent / "results" / "collector.md"
REPLY = json.dumps({"analysis": "a", "plan": "p", "commands": [{"keystrokes": "ls\n",
                                                                  "duration": 0}],
                    "task_complete": False})


class NoopSandbox(Sandbox):
    """Answers every command at once with success and a shell prompt; holds no files."""

    async def start(self) -> None:
        self._started_at = time.monotonic()

    async def exec(self, command, timeout=None, cwd=None, env=None, user=None) -> ExecResult:
        # A prompt, not nothing: the terminal polls an empty pane for up to 5 s at its start.
        return ExecResult(0, "$ ", "")

    async def extract(self, archive, remote_dir) -> None:
        pass

    async def upload(self, local, remote) -> None:
        pass  # the default packs a tar on the host (the verifier's tests/): not ours to time

    async def read_file(self, remote, limit=FILE_READ_LIMIT) -> bytes | None:
        return None  # missing: the verifier scores "no reward file"

    async def collect(self, remote, writer) -> bool:
        return False  # the artifact path does not exist: an empty bundle

    async def kill_processes(self) -> None:
        pass

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


def instant_server(reply_ids: list[int]) -> tuple[BaseProcess, str]:
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


async def agent_steps(concurrency: int, tokenizer,
                      client: InferenceClient) -> tuple[int, list[int], float]:
    """(steps, a prompt of the mean prompt length, seconds) of concurrency x 50-step Terminus
    rollouts. The prompt is the head of a real one: its ids cost what the agents' cost to send
    (a JSON body of 5-digit ids is twice one of 1-digit ids)."""
    config = RunConfig.model_validate({
        "sandbox": {"backend": "noop"}, "agent": {"max_turns": STEPS_PER_ROLLOUT},
        "inference": {"max_tokens": MAX_TOKENS},
        "collector": {"max_concurrent_sandboxes": concurrency,
                      "max_inflight_requests": concurrency}})
    width = min(concurrency, 8)  # tasks x samples per task = concurrency
    tasks = resolve_tasks("demo")[:width]
    with tempfile.TemporaryDirectory() as run_dir:
        store = TrajectoryStore(Path(run_dir), writable=True)

        def sessions(agent, session_id):
            return LLMSession(client, tokenizer, SessionConfig(max_tokens=MAX_TOKENS),
                              tools=agent.tools, session_id=session_id)
        collector = Collector(config, TerminusAgent, store, sessions)
        started = time.perf_counter()
        results = await collector.run(tasks, concurrency // width)
        elapsed = time.perf_counter() - started
        store.close()
    turns = [turn for g in results for t in g.trajectories for s in t.segments for turn in s.turns]
    mean = sum(len(turn.prompt_ids) for turn in turns) // max(1, len(turns))
    longest = max((turn.prompt_ids for turn in turns), key=len, default=())
    return len(turns), list(longest[:mean]), elapsed


async def floor(requests: int, concurrency: int, prompt: list[int],
                client: InferenceClient) -> float:
    """Seconds for `requests` bare completions, `concurrency` at a time (one worker each, as
    each agent waits for its reply before the next step)."""
    sampling = Sampling(max_tokens=MAX_TOKENS)
    left = requests

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await client.complete(prompt, sampling)
    started = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(concurrency)])
    return time.perf_counter() - started


async def overhead(concurrency: int, tokenizer, url: str) -> tuple[float, float]:
    """(agent steps/s, floor requests/s) at one concurrency, through one client."""
    async with InferenceClient([url]) as client:
        steps, prompt, elapsed = await agent_steps(concurrency, tokenizer, client)
        if steps != concurrency * STEPS_PER_ROLLOUT:  # a rollout failed: the rate would lie
            raise RuntimeError(f"{steps} steps, not {concurrency * STEPS_PER_ROLLOUT}")
        floor_s = await floor(steps, concurrency, prompt, client)
    return steps / elapsed, steps / floor_s


async def rollouts_per_minute(count: int) -> float:
    # Explicit budgets (not the embedded defaults) so the figure stays comparable over time.
    config = RunConfig.model_validate({"agent": {"name": "terminus", "max_turns": 2},
                                       "inference": {"max_tokens": 32},
                                       "collector": {"max_concurrent_sandboxes": 4}})
    tasks = resolve_tasks("demo", limit=count)
    with tempfile.TemporaryDirectory() as run_dir:
        store = TrajectoryStore(Path(run_dir), writable=True)
        async with model_sessions(config, Path(run_dir)) as model:
            collector = Collector(config, TerminusAgent, store, model.sessions)
            started = time.perf_counter()
            await collector.run(tasks, 1)
            elapsed = time.perf_counter() - started
        store.close()
    return count / elapsed * 60


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    plugins.register(plugins.SANDBOXES, "noop", NoopSandbox)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))
    server, url = instant_server(
        [*tokenizer.encode(REPLY, add_special_tokens=False), tokenizer.eos_token_id])
    rows = []
    try:
        asyncio.run(overhead(2, tokenizer, url))  # warm-up: first-use imports (pandas via Arrow)
        for run in range(1, runs + 1):
            for concurrency in (1, 16, 64):
                steps, bare = asyncio.run(overhead(concurrency, tokenizer, url))
                rows.append((run, concurrency, steps, bare))
                print(f"run {run}, concurrency {concurrency}: {steps:.0f} steps/s, floor "
                      f"{bare:.0f} requests/s, fraction {steps / bare:.2f}", flush=True)
    finally:
        server.terminate()
    per_minute = asyncio.run(rollouts_per_minute(4))
    at_16 = [steps / bare for _, concurrency, steps, bare in rows if concurrency == 16]
    lines = ["# Collector overhead against the bare client", "",
             f"`benchmarks/collector.py {runs}`: Terminus, {STEPS_PER_ROLLOUT}-step rollouts, "
             "instant-reply server, no-op sandbox; floor: as many bare `InferenceClient.complete` "
             "calls (the head of a real prompt, of the agents' mean prompt length) at the same "
             "concurrency to the same server in the same run. Fraction = steps/s / floor "
             "requests/s; target >= 0.5 at concurrency 16.", "",
             "| run | concurrency | steps/s | floor req/s | fraction |",
             "|---|---:|---:|---:|---:|",
             *(f"| {run} | {c} | {steps:.0f} | {bare:.0f} | {steps / bare:.2f} |"
               for run, c, steps, bare in rows), "",
             f"At concurrency 16: fractions {', '.join(f'{f:.2f}' for f in at_16)} "
             f"({'met' if min(at_16) >= 0.5 else 'NOT met'} in every run).", "",
             f"End to end with the embedded SmolLM2 (4 demo tasks, 2 turns x 32 tokens, local "
             f"sandboxes): {per_minute:.1f} rollouts/min.", ""]
    RESULTS.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
