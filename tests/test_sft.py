"""`skyrl-agent sft` on a stored run: the loss falls, and the saved folder is served."""

from __future__ import annotations

import asyncio

import pytest

from skyrl_agent.backends.torch_backend import TorchBackend
from skyrl_agent.config import load_config
from skyrl_agent.data.store import TrajectoryStore
from skyrl_agent.inference.client import InferenceClient, Sampling
from skyrl_agent.inference.process import embedded_server
from skyrl_agent.jobs.rollout import Rollout
from skyrl_agent.rl.batch import sft_data
from tests.test_cli import assert_one_line_error, run
from tests.tiny_models import char_model_dir

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stored_run(tmp_path_factory):
    """Eight replies of a random character model to toy/eight-a, stored by a real rollout."""
    root = tmp_path_factory.mktemp("sft")
    model = char_model_dir(root / "model")
    config = load_config(None, ["agent.name=answer", "tasks.source=toy",
                                f"inference.model={model}", "inference.max_tokens=8"])
    job = Rollout(config, 8, root / "run")
    try:
        asyncio.run(job.run(lambda t: None))
    finally:
        job.close()
    return root / "run", model


def test_sft_lowers_the_loss_and_the_output_serves(stored_run, tmp_path):
    run_dir, base = stored_run
    out = tmp_path / "tuned"
    result = run("sft", "--data", str(run_dir), "--output", str(out), "--epochs", "8",
                 "--batch-size", "4", "--set", "trainer.learning_rate=1e-2")
    assert result.returncode == 0, result.stderr
    [line] = [x for x in result.stdout.splitlines() if "mean loss by epoch:" in x]
    losses = [float(x) for x in line.split(":")[1].split()]
    assert len(losses) == 8 and losses[-1] < losses[0] * 0.6, losses

    data = sft_data(TrajectoryStore(run_dir).load().trajectories)
    tuned_loss = TorchBackend(out).forward_backward(data, "cross_entropy",
                                                    {"reduction": "token-mean"}).loss
    base_loss = TorchBackend(base).forward_backward(data, "cross_entropy",
                                                    {"reduction": "token-mean"}).loss
    assert tuned_loss < base_loss * 0.6  # the saved folder holds the trained weights

    async def served() -> tuple[tuple[int, ...], tuple[float, ...]]:
        with embedded_server(str(out)) as server:
            async with InferenceClient([server.url]) as client:
                reply = await client.complete(list(data[0].model_input), Sampling(max_tokens=4))
        return reply.token_ids, reply.logprobs

    ids, logprobs = asyncio.run(served())
    assert len(ids) >= 1 and len(logprobs) == len(ids)


def test_sft_rejects_bad_input_with_one_line(stored_run, tmp_path):
    assert_one_line_error(run("sft", "--data", str(tmp_path / "nothing")), "not a run directory")
    out = tmp_path / "busy"
    out.mkdir()
    (out / "file").write_text("x")
    run_dir, _ = stored_run
    assert_one_line_error(run("sft", "--data", str(run_dir), "--output", str(out)),
                          "not empty")
