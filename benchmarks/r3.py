"""Rollout Routing Replay (R3) under a real numerics mismatch: the sampler in bfloat16, the
trainer in float32, on a small random Qwen3-MoE (4 layers, 16 experts, top-2, routers started
with small weights so their logits lie close together, as in a freshly initialized MoE).

1. Same trajectories, R3 off and on: two-turn sessions sampled by the embedded server (float32,
   then bfloat16) with their recorded routing, scored by the float32 torch backend. Reported:
   the share of (token, layer) routing decisions where the trainer's own top-k differs from the
   sampler's, the share of decisions where the experts the trainer computed through differ
   (that share is what R3 removes), and the sampler/trainer logprob gap on the sampled tokens
   (max, mean, k3 KL).
2. A short RL run where the mismatch is live: `toy/eight-a` (GRPO, 16 samples, 12 steps) with
   the bfloat16 server, R3 off and on, from the same seed: reward and agreement per step. The
   model is the tests' smaller MoE (2 layers, 8 experts, top-2, hidden 32), whose random
   replies hold a few a's: the larger one's hold none, so GRPO would get no signal from it.

Run: .venv/bin/python benchmarks/r3.py   (about 4 minutes on 2 cores; writes
benchmarks/results/r3.md and r3.png)
"""

from __future__ import annotations

import asyncio
import os
import random
import tempfile
import time
from pathlib import Path

from skyrl_agent.backends.torch_backend import TorchBackend
from skyrl_agent.config import load_config
from skyrl_agent.inference.client import InferenceClient
from skyrl_agent.inference.process import embedded_server
from skyrl_agent.jobs.train import reference_run
from skyrl_agent.llm.session import LLMSession, SessionConfig
from skyrl_agent.rl.batch import trajectory_data
from skyrl_agent.types import FinishReason, Reward, Trajectory
from tests.tiny_models import char_moe_dir, char_tokenizer

RESULTS = Path(__file__).parent / "results"
SESSIONS = 32
RL_STEPS = 12


def bench_model(folder: Path) -> Path:
    return char_moe_dir(folder, hidden=64, layers=4, experts=16, top_k=2, router_std=0.1)


def rl_model(folder: Path) -> Path:
    return char_moe_dir(folder)


async def _session(client: InferenceClient, index: int) -> Trajectory:
    rng = random.Random(index)
    words = " ".join("".join(rng.choice("abcdefghij") for _ in range(5)) for _ in range(12))
    session = LLMSession(client, char_tokenizer(), SessionConfig(max_tokens=48), seed=index)
    await session.chat([{"role": "user", "content": words}])
    await session.chat([{"role": "user", "content": words[::-1]}])
    session.close()
    return Trajectory("bench/r3", index, "bench", session.segments, Reward(0.0),
                      FinishReason.STOP)


async def _sample(url: str) -> list[Trajectory]:
    async with InferenceClient([url], routed_experts=True) as client:
        return list(await asyncio.gather(*[_session(client, i) for i in range(SESSIONS)]))


def same_trajectories(model: Path) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for server_dtype in ("float32", "bfloat16"):
        with embedded_server(str(model), dtype=server_dtype) as server:
            trajectories = asyncio.run(_sample(server.url))
        data = [d for t in trajectories for d in trajectory_data(t, 1.0)]
        for replay in (False, True):
            backend = TorchBackend(model, dtype="float32", routing_replay=replay)
            metrics = backend.forward_backward(data, "importance_sampling").metrics
            backend.close()
            own = metrics.get("routing/differing", 0.0)
            rows.append({"server": server_dtype, "r3": "on" if replay else "off",
                         "tokens": int(metrics["tokens"]), "own_differs": own,
                         "used_differs": 0.0 if replay else own,
                         "max": metrics["agreement/max_abs_diff"],
                         "mean": metrics["agreement/mean_abs_diff"],
                         "kl": metrics["agreement/kl"]})
    return rows


def rl_run(model: Path, replay: bool, folder: Path) -> list[dict[str, float]]:
    config = load_config(None, [
        "agent.name=answer", "tasks.source=toy", f"inference.model={model}",
        "inference.dtype=bfloat16", "inference.max_tokens=8",
        "collector.n_samples_per_task=16", "trainer.learning_rate=3e-2",
        f"trainer.max_steps={RL_STEPS}", f"trainer.routing_replay={str(replay).lower()}",
        f"sandbox.work_root={folder / 'work'}"])
    results = asyncio.run(reference_run(config, folder / "run"))
    if not any("agreement/max_abs_diff" in r.metrics for r in results):
        raise SystemExit(f"the RL run trained on nothing: see {folder / 'run'}")
    nan = float("nan")
    return [{"reward": r.reward_mean, "max": r.metrics.get("agreement/max_abs_diff", nan),
             "kl": r.metrics.get("agreement/kl", nan),
             "own_differs": r.metrics.get("routing/differing", float("nan"))}
            for r in results]


def write(rows: list[dict[str, object]], curves: dict[str, list[dict[str, float]]],
          seconds: float) -> None:
    lines = ["# Rollout Routing Replay under a numerics mismatch", "",
             "Command: `.venv/bin/python benchmarks/r3.py` "
             f"(this run: {seconds:.0f} s on 2 cores). Models: random Qwen3-MoE over a "
             "character vocabulary (4 layers, 16 experts, top-2, hidden 64; the RL run: 2 "
             "layers, 8 experts, top-2, hidden 32). Trainer: torch backend, float32.", "",
             f"## Same trajectories ({SESSIONS} two-turn sessions), R3 off and on", "",
             "`own differs`: share of (token, layer) routing decisions where the trainer's own "
             "top-k set differs from the sampler's. `used differs`: the same for the experts "
             "the trainer actually computed through (R3 replays the sampler's). Gap: "
             "|trainer - sampler| logprob on sampled tokens; KL: k3 estimate of "
             "KL(sampler || trainer).", "",
             "| server | R3 | tokens | own differs | used differs | max gap | mean gap | KL |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['server']} | {r['r3']} | {r['tokens']} | {r['own_differs']:.4f} "
                     f"| {r['used_differs']:.4f} | {r['max']:.2e} | {r['mean']:.2e} "
                     f"| {r['kl']:.2e} |")
    lines += ["", f"## RL on toy/eight-a, bfloat16 sampler, {RL_STEPS} steps of 16 samples", "",
              "| step | reward R3 off | reward R3 on | max gap off | max gap on | KL off "
              "| KL on | own differs (on) |", "|---|---|---|---|---|---|---|---|"]
    off, on = curves["off"], curves["on"]
    for step, (a, b) in enumerate(zip(off, on, strict=True), start=1):
        lines.append(f"| {step} | {a['reward']:.3f} | {b['reward']:.3f} | {a['max']:.2e} "
                     f"| {b['max']:.2e} | {a['kl']:.2e} | {b['kl']:.2e} "
                     f"| {b['own_differs']:.4f} |")
    (RESULTS / "r3.md").write_text("\n".join(lines) + "\n")
    _plot(curves)


def _plot(curves: dict[str, list[dict[str, float]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (reward, gap) = plt.subplots(1, 2, figsize=(9, 3.4))
    for name, points in curves.items():
        steps = range(1, len(points) + 1)
        reward.plot(steps, [p["reward"] for p in points], marker="o", label=f"R3 {name}")
        gap.plot(steps, [p["max"] for p in points], marker="o", label=f"R3 {name}")
    reward.set(title="reward (toy/eight-a)", xlabel="step")
    gap.set(title="max |trainer - sampler| logprob", xlabel="step", yscale="log")
    reward.legend()
    figure.tight_layout()
    figure.savefig(RESULTS / "r3.png", dpi=120)


def main() -> None:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="r3-") as tmp:
        os.chmod(tmp, 0o711)  # the sandboxes' unprivileged user reaches its work root below
        model = bench_model(Path(tmp) / "model")
        rows = same_trajectories(model)
        for row in rows:
            print(row, flush=True)
        small = rl_model(Path(tmp) / "small")
        curves = {name: rl_run(small, name == "on", Path(tmp) / name) for name in ("off", "on")}
    write(rows, curves, time.monotonic() - started)
    print((RESULTS / "r3.md").read_text())


if __name__ == "__main__":
    main()
