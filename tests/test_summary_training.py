"""Training through self-summarization: the summary turns of real summarized trajectories (a
long-horizon task's demonstrations, recorded by the real agent, session and sandboxes) get the
trajectory's gradient, with its sign, in the trainer's own packing and loss."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from skyrl_agent.backends.backend import AdamParams, Datum
from skyrl_agent.backends.torch_backend import TorchBackend
from skyrl_agent.config import load_config
from skyrl_agent.data.store import TrajectoryStore
from skyrl_agent.jobs.demos import DemoJob
from skyrl_agent.rl.batch import trajectory_data
from skyrl_agent.types import Segment, Trajectory

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def summarized(tmp_path_factory) -> list[Trajectory]:
    """Demonstrations of two follow-clues@2 tasks at a 2,048-token context: each summarizes."""
    run_dir = tmp_path_factory.mktemp("summarized") / "run"
    config = load_config(None, ["agent.name=terminus", "tasks.source=gen:follow-clues@2:train:2",
                                "agent.max_context_tokens=2048", "agent.max_turns=30"])
    job = DemoJob(config, run_dir)
    try:
        asyncio.run(job.run())
    finally:
        job.close()
    trajectories = TrajectoryStore(run_dir).load().trajectories
    assert len(trajectories) == 2 and all(len(t.segments) >= 2 for t in trajectories)
    return trajectories


def summary_positions(segment: Segment) -> list[int]:
    """Datum positions (position i predicts token i + 1) of the segment's summary reply."""
    turn = segment.turns[segment.summary_turn_index]  # type: ignore[index]
    start = len(turn.prompt_ids) - 1
    return list(range(start, start + len(turn.completion_ids)))


def only_at(datum: Datum, positions: list[int], logprobs: tuple[float, ...]) -> Datum:
    """The datum's own weights and advantages at `positions`, zero elsewhere, and `logprobs` as
    the sampler's (the update is on-policy: importance ratio 1)."""
    inputs = dict(datum.loss_fn_inputs)
    for key in ("weights", "advantages"):
        inputs[key] = tuple(v if i in positions else 0.0 for i, v in enumerate(inputs[key]))
    return dataclasses.replace(datum, loss_fn_inputs={**inputs, "logprobs": logprobs})


def mean_at(rows: list[tuple[float, ...]], positions: list[list[int]]) -> float:
    values = [row[p] for row, ps in zip(rows, positions, strict=True) for p in ps]
    return sum(values) / len(values)


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_summary_turns_get_the_trajectorys_gradient_with_its_sign(summarized, tiny_model_dir,
                                                                  advantage):
    """Stops: summary turns packed with no loss weight or no advantage, recorded without a loss
    mask, or left out of the packed segment: then the update restricted to the summary replies
    is empty and their logprobs do not move. A positive trajectory's summaries must become more
    likely after one importance-sampling step, a negative one's less likely."""
    data, positions = [], []
    for trajectory in summarized:
        for segment in trajectory.segments:
            if segment.summary_turn_index is None:
                continue
            alone = dataclasses.replace(trajectory, segments=(segment,))
            [datum] = trajectory_data(alone, advantage)
            data.append(datum)
            positions.append(summary_positions(segment))
    assert len(data) >= 2
    backend = TorchBackend(tiny_model_dir)
    before = backend.forward(data)
    step = [only_at(d, ps, lp) for d, ps, lp in zip(data, positions, before, strict=True)]
    out = backend.forward_backward(step, "importance_sampling")
    assert out.loss != 0.0
    backend.optim_step(AdamParams(learning_rate=1e-3))
    moved = mean_at(backend.forward(data), positions) - mean_at(before, positions)
    assert moved * advantage > 0.05, moved
