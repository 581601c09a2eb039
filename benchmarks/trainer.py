"""The trainer's costs against floors measured in the same run: weight sync, packing, throughput.

1. Weight sync, end to end, with SmolLM2-135M (CPU, float32, full fine-tune): a TorchBackend
   trainer and an embedded server on the same model. Each row is the median of 5 runs after one
   warm-up; before every run (untimed) the trainer's parameters are nudged in place, as an
   optimizer step would, so every export carries new values. Rows:
   (a) the floor: copy_ of every trainer parameter into a second in-process copy of the model;
   (b) ours: `publish` (shared-memory file -> server pause(keep) / update_weights / resume),
       alone and followed by a 1-token completion (the server sampling with the new weights);
   (c) the file way: safetensors save_file to /dev/shm (a new file each time), then the same
       pause / update_weights / resume;
   (d) parts, in-process: save_file alone, SharedWeights.write of every parameter (what a trainer
       pays when its parameters cannot live in the file: LoRA, GPU), the server-side load with
       the mapping kept (WeightLoader) and with a fresh mapping (load_weights).
   The server's own load seconds (update_weights' reply) are shown for (b) and (c); a 1-token
   completion without any update is the request's own cost. Target: (b) within 2x of (a).
2. Packing vs one sample per turn on the same stored multi-turn trajectories (`--data RUN_DIR`,
   else a Terminus rollout on 4 demo tasks x 2 samples, 4 turns of 48 tokens, made once under
   the temporary directory and reused): sequences, tokens read, and the seconds of one
   cross-entropy forward_backward (median of 3, after a warm-up on one sequence); both must
   give the same loss (the same tokens are trained on the same prefixes).
3. forward_backward tokens/s at the default micro_batch_tokens (2048), from the runs of 2.

Run: .venv/bin/python benchmarks/trainer.py [--data RUN_DIR]   (several minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoTokenizer

from skyrl_agent.backends.backend import Datum
from skyrl_agent.backends.torch_backend import TorchBackend
from skyrl_agent.config import load_config
from skyrl_agent.data.store import TrajectoryStore
from skyrl_agent.inference.client import InferenceClient, Sampling
from skyrl_agent.inference.process import embedded_server
from skyrl_agent.jobs.rollout import Rollout
from skyrl_agent.model.loading import load_causal_lm
from skyrl_agent.model.names import resolve_model
from skyrl_agent.model.weights.files import shared_memory_dir
from skyrl_agent.model.weights.reader import WeightLoader, load_weights
from skyrl_agent.model.weights.writer import SharedWeights
from skyrl_agent.rl.batch import pack_turns, sft_data
from skyrl_agent.rl.step import publish
from skyrl_agent.types import Trajectory

RUNS = 5
TRAIN_RUNS = 3
MODEL = "smollm2-135m"
MULTI_TURN = Path(tempfile.gettempdir()) / "skyrl-agent-bench-multiturn"
ROLLOUT = ["agent.name=terminus", "tasks.source=demo", "tasks.limit=4", "agent.max_turns=4",
           "inference.max_tokens=48"]
SAMPLES = 2
ONE_TOKEN = Sampling(max_tokens=1, temperature=0.0)
Row = tuple[str, float]


class RecordingClient(InferenceClient):
    """An InferenceClient that keeps the seconds each server reports for its weight loads."""

    def __init__(self, urls: Sequence[str]) -> None:
        super().__init__(urls)
        self.loads: list[float] = []

    async def update_weights(self, path: str, version: int) -> list[float]:
        seconds = await super().update_weights(path, version)
        self.loads.extend(seconds)
        return seconds


async def timed(action: Callable[[], object], setup: Callable[[], object] = lambda: None,
                runs: int = RUNS, warm_up: Callable[[], object] | None = None) -> float:
    """Median seconds of `runs` runs of `action` (sync or async) after one warm-up (`action`
    itself unless `warm_up` is given); `setup` runs untimed before each."""
    times = []
    for run in range(runs + 1):
        setup()
        started = time.perf_counter()
        result = warm_up() if run == 0 and warm_up is not None else action()
        if inspect.isawaitable(result):
            await result
        times.append(time.perf_counter() - started)
    return statistics.median(times[1:])


def plain_copy(source: dict[str, torch.Tensor], target: torch.nn.Module) -> None:
    with torch.no_grad():
        for name, param in target.named_parameters():
            param.copy_(source[name])


class Nudge:
    """Changes every parameter in place (+-1e-5, alternating): what a step does to the pages."""

    def __init__(self, params: dict[str, torch.nn.Parameter]) -> None:
        self.params = params
        self.sign = 1.0

    def __call__(self) -> None:
        self.sign = -self.sign
        with torch.no_grad():
            for param in self.params.values():
                param.add_(1e-5 * self.sign)


class FreshFiles:
    """A new safetensors path for every save; the previous one is removed first."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.count = 0
        self.path = self._next()

    def _next(self) -> Path:
        self.count += 1
        return shared_memory_dir() / f"{self.prefix}-{os.getpid()}-{self.count}.safetensors"

    def advance(self) -> None:
        self.path.unlink(missing_ok=True)
        self.path = self._next()

    def close(self) -> None:
        self.path.unlink(missing_ok=True)


async def weight_sync(backend: TorchBackend, url: str) -> tuple[list[Row], list[Row]]:
    """(rows with their ratio to the floor, the servers' own load seconds)."""
    params = backend.params
    backend.save_weights_for_sampler(0)  # creates the shared file: the parameters move into it
    tensors = {name: p.detach() for name, p in params.items()}
    nudge = Nudge(params)
    second = load_causal_lm(backend.model_folder, backend.dtype, backend.device, None)
    tokenizer = AutoTokenizer.from_pretrained(backend.model_folder)
    prompt = tokenizer.encode("The capital of France is")
    version = 0

    async with RecordingClient([url]) as client:
        async def ours(first_token: bool) -> None:
            nonlocal version
            version += 1
            await publish(backend, client, version)
            if first_token:
                await client.complete(prompt, ONE_TOKEN)

        files = FreshFiles("skyrl-agent-bench-save")

        async def file_way() -> None:
            nonlocal version
            version += 1
            save_file(tensors, files.path)
            await client.pause("keep")
            try:
                await client.update_weights(str(files.path), version)
            finally:
                await client.resume()

        def nudge_and_advance() -> None:
            nudge()
            files.advance()

        rows: list[Row] = [("(a) floor: copy_ into a second model",
                            await timed(lambda: plain_copy(tensors, second), nudge))]
        client.loads.clear()
        rows.append(("(b) publish (shared memory)", await timed(lambda: ours(False), nudge)))
        loads = [("(b) publish", statistics.median(client.loads[-RUNS:]))]
        rows.append(("(b) publish + 1-token completion",
                     await timed(lambda: ours(True), nudge)))
        try:
            rows.append(("(c) save_file + pause/update/resume",
                         await timed(file_way, nudge_and_advance)))
            loads.append(("(c) save_file + update (new file)",
                          statistics.median(client.loads[-RUNS:])))
            rows.append(("(d) save_file alone", await timed(
                lambda: save_file(tensors, files.path), nudge_and_advance)))
        finally:
            files.close()
        with SharedWeights(shared_memory_dir() / f"skyrl-agent-bench-{os.getpid()}.safetensors",
                           tensors) as shared:
            rows.append(("(d) SharedWeights.write, all params",
                         await timed(lambda: shared.write(tensors), nudge)))
        update = backend.save_weights_for_sampler(version)
        loader = WeightLoader()
        try:
            rows.append(("(d) WeightLoader.load, mapping kept",
                         await timed(lambda: loader.load(second, update.path), nudge)))
        finally:
            loader.close()
        rows.append(("(d) load_weights, fresh mapping",
                     await timed(lambda: load_weights(second, update.path), nudge)))
        loads.append(("1-token completion, no update",
                      await timed(lambda: client.complete(prompt, ONE_TOKEN))))
    return rows, loads


def multi_turn_trajectories(data: Path | None) -> list[Trajectory]:
    """The stored trajectories of `data`, else of the cached rollout (collected when missing or
    unfinished: the job resumes)."""
    if data is None:
        data = MULTI_TURN
        settings = load_config(None, [*ROLLOUT, f"output_dir={data}"])
        job = Rollout(settings, SAMPLES, data)
        if job.pending:
            print(f"collecting {len(job.pending)} multi-turn rollouts into {data} "
                  f"(a few minutes)...", file=sys.stderr)
        try:
            asyncio.run(job.run(lambda trajectory: None))
        finally:
            job.close()
    contents = TrajectoryStore(data).load()
    for problem in contents.problems:
        print(problem, file=sys.stderr)
    return [t for t in contents.trajectories if not t.masked]


def per_turn_data(trajectories: Sequence[Trajectory]) -> list[Datum]:
    """The baseline: one datum per model call, trained only on that call's sampled tokens."""
    return [datum for t in trajectories for segment in t.segments for turn in segment.turns
            if (datum := pack_turns([turn], 1.0)) is not None]


def packing(backend: TorchBackend, trajectories: Sequence[Trajectory],
            ) -> list[tuple[str, int, int, float]]:
    """(name, sequences, tokens read, seconds) of packed and per-turn data; same loss checked."""
    out = []
    losses: dict[str, float] = {}
    packed, per_turn = sft_data(trajectories), per_turn_data(trajectories)
    assert sum(d.num_loss_tokens for d in packed) == sum(d.num_loss_tokens for d in per_turn)
    for name, data in (("packed (one per segment)", packed), ("one per turn", per_turn)):
        def step(data: list[Datum] = data, name: str = name) -> None:
            losses[name] = backend.forward_backward(
                data, "cross_entropy", {"reduction": "token-mean"}).loss

        def warm_up(data: list[Datum] = data) -> None:  # a full run would take minutes
            backend.forward_backward(data[:1], "cross_entropy", {"reduction": "token-mean"})

        seconds = asyncio.run(timed(step, lambda: backend.optimizer.zero_grad(set_to_none=True),
                                    TRAIN_RUNS, warm_up))
        out.append((name, len(data), sum(len(d.model_input) for d in data), seconds))
    first, second = losses.values()
    if abs(first - second) > 1e-4:
        raise SystemExit(f"packing changes the loss: {losses} (the same tokens are trained)")
    print(f"loss: {losses}")
    return out


def load_line(label: str) -> str:
    one, five, _ = os.getloadavg()
    return f"{label}: load average {one:.1f} (1 min), {five:.1f} (5 min)"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, help="a rollout run dir of multi-turn trajectories")
    args = parser.parse_args(argv)
    trajectories = multi_turn_trajectories(args.data)
    turns = sum(len(s.turns) for t in trajectories for s in t.segments)
    folder = resolve_model(MODEL)
    backend = TorchBackend(folder)
    try:
        size = sum(p.nbytes for p in backend.params.values())
        print(load_line(f"\nweight sync, SmolLM2-135M float32, {size / 2**20:.0f} MiB, "
                        f"{torch.get_num_threads()} torch threads, median of {RUNS}"))
        with embedded_server(MODEL) as server:
            assert server.url is not None
            rows, loads = asyncio.run(weight_sync(backend, server.url))
        floor = rows[0][1]
        print(f"{'':44} {'median s':>9} {'x (a)':>7}")
        for name, seconds in rows:
            print(f"{name:44} {seconds:9.4f} {seconds / floor:7.2f}")
        print("server-side seconds (its reply to update_weights) and the request alone:")
        for name, seconds in loads:
            print(f"{name:44} {seconds:9.4f} {seconds / floor:7.2f}")
        print(load_line("after weight sync"))

        print(load_line(f"\npacking: {len(trajectories)} trajectories, {turns} turns, "
                        f"cross_entropy forward_backward, micro_batch_tokens "
                        f"{backend.micro_batch_tokens}, median of {TRAIN_RUNS}"))
        results = packing(backend, trajectories)
        base = results[0][3]
        print(f"{'':26} {'sequences':>9} {'tokens':>8} {'seconds':>8} {'x packed':>9} "
              f"{'tokens/s':>9}")
        for name, sequences, tokens, seconds in results:
            print(f"{name:26} {sequences:9} {tokens:8} {seconds:8.2f} {seconds / base:9.2f} "
                  f"{tokens / seconds:9.0f}")
        print(load_line("after packing"))
    finally:
        backend.close()


if __name__ == "__main__":
    main()
