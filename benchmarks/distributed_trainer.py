"""The sharded backends on SmolLM2-135M against the one-process torch backend, in one run.

For each backend — torch (one process, the reference), FSDP2 over 2 gloo ranks, Megatron at
tensor parallel 3 (SmolLM2 has 9 heads and 3 key-value heads: TP 1 or 3 only) — on the same
batch of real text (4 sequences of 128 tokens, float32, CPU):
- agreement with the reference: per-token logprobs (max |diff|), gradients after one
  importance-sampling forward_backward, parameters after one AdamW step (lr 1e-5), all compared
  by Hugging Face names;
- seconds: start-up (ranks spawned, model loaded and split), one forward_backward + optim_step
  (median of STEPS), and a weight sync to the sampler's shared-memory file (median of 3, after
  the first, which lays the file out).

Run: .venv/bin/python benchmarks/distributed_trainer.py   (about 10 minutes on 2 cores; writes
benchmarks/results/distributed_trainer.md)
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from skyrl_agent.backends.backend import AdamParams, Datum
from skyrl_agent.backends.fsdp_backend import FsdpBackend
from skyrl_agent.backends.megatron.backend import MegatronBackend
from skyrl_agent.backends.torch_backend import TorchBackend
from skyrl_agent.model.names import resolve_model

STEPS = 2
SYNCS = 3
ADAM = AdamParams(learning_rate=1e-5, grad_clip_norm=1.0)
RESULTS = Path(__file__).parent / "results" / "distributed_trainer.md"
TEXT = ("The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins "
        "with a single step. To be or not to be, that is the question. ") * 12


def batch(folder: Path) -> list[Datum]:
    """4 sequences of 128 tokens of text; every target trained, advantages of both signs."""
    ids = AutoTokenizer.from_pretrained(folder).encode(TEXT)
    data = []
    for row in range(4):
        tokens = ids[row * 16: row * 16 + 129]
        n = len(tokens) - 1
        data.append(Datum(tuple(tokens[:-1]), {
            "target_tokens": tuple(tokens[1:]), "weights": (1.0,) * n,
            "advantages": tuple(1.0 if (row + i) % 3 else -0.5 for i in range(n))}))
    return data


def with_logprobs(data: list[Datum], logprobs: list[tuple[float, ...]]) -> list[Datum]:
    """The batch as if the reference had sampled it (ratio 1 for the reference)."""
    return [Datum(d.model_input, {**d.loss_fn_inputs, "logprobs": lp})
            for d, lp in zip(data, logprobs, strict=True)]


def timed(work: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    out = work()
    return out, time.perf_counter() - started


def gap(one: dict[str, torch.Tensor], other: dict[str, torch.Tensor], label: str) -> str:
    """Max |diff| over every tensor, and relative to the largest |value| of that tensor."""
    gaps = {n: float((one[n].detach().float() - other[n].float()).abs().max()) for n in one}
    worst = max(gaps, key=gaps.__getitem__)
    scale = float(one[worst].abs().max())
    print(f"  {label}: worst {worst} {gaps[worst]:.2e} (its max |value| {scale:.2e})",
          file=sys.stderr)
    return f"{gaps[worst]:.1e} ({gaps[worst] / scale:.0e} rel.)"


def measure(name: str, make: Callable[[], Any], data: list[Datum],
            reference: dict[str, Any] | None) -> dict[str, Any]:
    print(f"{name}: starting", file=sys.stderr, flush=True)
    backend, start = timed(make)
    try:
        logprobs = backend.forward(data)
        row: dict[str, Any] = {"backend": name, "start_s": start, "logprobs": logprobs}
        out = backend.forward_backward(data, "importance_sampling")
        grads = (backend.full_tensors("grads") if hasattr(backend, "full_tensors")
                 else {n: p.grad.clone() for n, p in backend.params.items()})
        backend.optim_step(ADAM)
        params = (backend.full_tensors("params") if hasattr(backend, "full_tensors")
                  else {n: p.detach().clone() for n, p in backend.params.items()})
        row.update(loss=out.loss, grads=grads, params=params)
        steps = []
        for _ in range(STEPS):
            _, seconds = timed(lambda: (backend.forward_backward(data, "importance_sampling"),
                                        backend.optim_step(ADAM)))
            steps.append(seconds)
        row["step_s"] = statistics.median(steps)
        backend.save_weights_for_sampler(0)
        row["sync_s"] = statistics.median(
            timed(lambda v=v: backend.save_weights_for_sampler(v))[1] for v in range(1, SYNCS + 1))
    finally:
        backend.close()
    if reference is not None:
        row["logprob_gap"] = f"{max(abs(a - b) for x, y in zip(logprobs, reference['logprobs'], strict=True) for a, b in zip(x, y, strict=True)):.1e}"  # noqa: E501
        row["grad_gap"] = gap(reference["grads"], grads, "grads")
        row["param_gap"] = gap(reference["params"], params, "params")
    print(f"{name}: done", file=sys.stderr, flush=True)
    return row


def main() -> None:
    folder = resolve_model("smollm2-135m")
    plain = batch(folder)
    data = with_logprobs(plain, TorchBackend(folder).forward(plain))
    torch_row = measure("torch, one process", lambda: TorchBackend(folder), data, None)
    rows = [torch_row,
            measure("FSDP2, 2 ranks", lambda: FsdpBackend(folder, world_size=2), data,
                    torch_row),
            measure("Megatron, TP 3", lambda: MegatronBackend(folder, tensor_parallel=3), data,
                    torch_row)]
    lines = [
        "# Sharded trainer backends vs one process (SmolLM2-135M, CPU, float32)",
        "",
        "Made by `.venv/bin/python benchmarks/distributed_trainer.py` on a 2-core machine (all "
        "ranks share the 2 cores: times are for comparison within this run only). Batch: 4 "
        "sequences x 128 tokens, importance_sampling loss, AdamW lr 1e-5. Gaps are max |diff| "
        "against the torch backend over every tensor, by Hugging Face names, and relative to "
        "the largest |value| of the tensor where it is largest.",
        "",
        "| backend | logprobs gap | grad gap | param gap after 1 step | start-up s | "
        "step s (fwd+bwd+optim) | weight sync s |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        gaps = [row.get(k, "(reference)")
                for k in ("logprob_gap", "grad_gap", "param_gap")]
        lines.append(f"| {row['backend']} | {' | '.join(gaps)} | {row['start_s']:.1f} | "
                     f"{row['step_s']:.2f} | {row['sync_s']:.3f} |")
    RESULTS.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
