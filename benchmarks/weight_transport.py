"""How a sharded trainer's rank 0 gets the sampler's weights into the servers' shared-memory file,
three ways side by side on one local Ray instance (SmolLM2-135M's weights, float32, CPU):

- direct: rank 0 runs on the servers' node and writes each tensor into the file (what the Ray
  placement does: distributed/ranks.py puts rank 0 beside the servers);
- Ray Direct Transport (RDT, alpha) over gloo: rank 0 returns the tensors by RDT to an actor on
  the servers' node, which writes them into the file (what a rank 0 on another node would need);
- Ray's object store: the same hand-over through the object store.

Each is timed to the file holding the weights (median of REPEATS, after one warm-up), and the
file is checked against the source tensors.

Run: .venv/bin/python benchmarks/weight_transport.py   (about a minute on 2 cores; writes
benchmarks/results/weight_transport.md)
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import ray
import torch
from ray.experimental.collective import create_collective_group
from safetensors.torch import load_file

from skyrl_agent.model.names import resolve_model
from skyrl_agent.model.weights.files import new_weights_path
from skyrl_agent.model.weights.writer import SharedWeights

REPEATS = 3
RESULTS = Path(__file__).parent / "results" / "weight_transport.md"


class Writer:
    """Owns the servers' shared-memory file; writes whatever tensors it is given."""

    def __init__(self, layout: dict[str, torch.Tensor]) -> None:
        self.shared = SharedWeights(new_weights_path(), layout)

    def write(self, tensors: dict[str, torch.Tensor]) -> float:
        """Seconds the write took; the time the file was complete."""
        started = time.perf_counter()
        self.shared.write(tensors)
        return time.perf_counter() - started

    def written(self) -> dict[str, torch.Tensor]:
        return {name: view.clone() for name, view in self.shared.views.items()}

    def close(self) -> None:
        self.shared.close()


class Rank(Writer):
    """A rank 0 holding the whole model (as after its gathers) beside a file of its own."""

    def __init__(self, folder: str) -> None:
        self.tensors = {n: t.float().contiguous()
                        for n, t in load_file(Path(folder) / "model.safetensors").items()}
        super().__init__(self.tensors)

    def layout(self) -> dict[str, torch.Tensor]:
        return {n: torch.empty_like(t, device="meta") for n, t in self.tensors.items()}

    def write_own(self) -> float:
        return self.write(self.tensors)

    @ray.method(tensor_transport="gloo")
    def by_rdt(self) -> dict[str, torch.Tensor]:
        return self.tensors

    def by_object_store(self) -> dict[str, torch.Tensor]:
        return self.tensors


def median_seconds(send: object) -> float:
    """Wall seconds from the call to the weights in the file, median of REPEATS."""
    times = []
    for attempt in range(REPEATS + 1):
        started = time.perf_counter()
        send()  # type: ignore[operator]
        if attempt:  # the first lays out transports and pages
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    folder = resolve_model("smollm2-135m")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR",
             runtime_env={"env_vars": {"GLOO_SOCKET_IFNAME": "lo"}})
    # Both ends need Ray's transfer thread: a receiver without it waits until RDT times out.
    remote = ray.remote(num_cpus=0, enable_tensor_transport=True)
    rank = remote(Rank).remote(str(folder))
    layout = ray.get(rank.layout.remote())
    writer = remote(Writer).remote(layout)
    create_collective_group([rank, writer], backend="torch_gloo")
    megabytes = sum(t.numel() * t.element_size() for t in layout.values()) / 1e6
    ways = {
        "direct: rank 0 writes the file (chosen)": lambda: ray.get(rank.write_own.remote()),
        "RDT over gloo, then a write beside the servers":
            lambda: ray.get(writer.write.remote(rank.by_rdt.remote())),
        "Ray object store, then a write beside the servers":
            lambda: ray.get(writer.write.remote(rank.by_object_store.remote())),
    }
    rows = [(name, median_seconds(send)) for name, send in ways.items()]
    source, written = ray.get(rank.written.remote()), ray.get(writer.written.remote())
    assert all(torch.equal(source[n], written[n]) for n in source), "the weights differ"
    ray.get([rank.close.remote(), writer.close.remote()])
    ray.shutdown()

    direct = rows[0][1]
    lines = [
        f"# Sampler weights from rank 0 into the servers' shared-memory file ({megabytes:.0f} MB)",
        "",
        "Made by `.venv/bin/python benchmarks/weight_transport.py` on a 2-core machine, one "
        f"local Ray instance (both actors on one node; gloo over loopback). SmolLM2-135M, "
        f"float32. Median of {REPEATS} after a warm-up; the file's bytes are checked against "
        "the source.",
        "",
        "| way | seconds | vs direct |",
        "|---|---|---|",
        *[f"| {name} | {seconds:.3f} | {seconds / direct:.1f}x |" for name, seconds in rows],
    ]
    RESULTS.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
