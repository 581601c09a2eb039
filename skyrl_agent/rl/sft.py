"""Supervised fine-tuning on a stored run: cross-entropy on the tokens the model sampled.

The same packing as RL (one sequence per segment, prompts and observations weight 0), the same
backend, and an output folder the inference server loads (`serve --model DIR`,
`rollout --set inference.model=DIR`). Masked trajectories are left out.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skyrl_agent.backends.backend import Datum, TrainerBackend
from skyrl_agent.backends.build import adam_params, make_backend
from skyrl_agent.backends.loss import LossConfig
from skyrl_agent.config import RunConfig
from skyrl_agent.data.run_dir import RunDir
from skyrl_agent.data.store import StoreError, TrajectoryStore
from skyrl_agent.errors import UserError
from skyrl_agent.rl.batch import sft_data
from skyrl_agent.tasks.families import refuse_heldout

log = logging.getLogger(__name__)
SFT_LOSS = LossConfig(reduction="token-mean")
"""Mean cross-entropy per trained token of each batch."""


@dataclass(frozen=True)
class SftStep:
    step: int
    epoch: int
    loss: float
    """Mean cross-entropy per trained token of the batch, before this step's update."""
    tokens: int


@dataclass(frozen=True)
class SftPlan:
    """What an SFT run will read and do, checked before the model loads."""

    data: list[Datum]
    model: str
    """The model fine-tuned: --model, else the one the run sampled from."""
    steps: int


def plan_sft(config: RunConfig, run_dir: Path, model: str | None, epochs: int,
             batch_size: int) -> SftPlan:
    """Read the run's trajectories into SFT data; one-line errors for unusable input."""
    try:
        contents = TrajectoryStore(run_dir).load()
    except StoreError as exc:
        raise UserError(str(exc)) from None
    for problem in contents.problems:
        log.warning(problem)
    refuse_heldout((t.task_id for t in contents.trajectories), str(run_dir))
    data = sft_data(contents.trajectories)
    if not data:
        raise UserError(f"{run_dir} has no unmasked trajectories with sampled tokens to train on")
    record = RunDir(run_dir).record()
    sampled_with = record.section("inference", "model") if record else None
    chosen = model or (sampled_with if isinstance(sampled_with, str) else None) \
        or config.inference.model
    _check_vocabulary(data, chosen)
    return SftPlan(data, chosen, epochs * -(-len(data) // batch_size))


def _check_vocabulary(data: Sequence[Datum], model: str) -> None:
    """Token ids the model has no embedding for mean the run used another tokenizer."""
    import json

    from skyrl_agent.model.names import resolve_model

    vocab = json.loads((resolve_model(model) / "config.json").read_text()).get("vocab_size")
    highest = max(max(d.model_input, default=0) for d in data)
    if isinstance(vocab, int) and highest >= vocab:
        raise UserError(f"the run holds token id {highest} but {model} has {vocab} tokens: it "
                        "was sampled with another tokenizer (choose its model with --model)")


def batches(data: Sequence[Datum], batch_size: int, epochs: int,
            seed: int) -> Iterator[tuple[int, list[Datum]]]:
    """Per epoch a seeded shuffle of the sequences, cut into batches."""
    rng = random.Random(seed)
    order = list(range(len(data)))
    for epoch in range(epochs):
        rng.shuffle(order)
        for start in range(0, len(order), batch_size):
            yield epoch, [data[i] for i in order[start:start + batch_size]]


def run_sft(config: RunConfig, plan: SftPlan, output: Path, epochs: int, batch_size: int,
            on_step: Callable[[SftStep], Any] = lambda s: None,
            backend: TrainerBackend | None = None) -> list[SftStep]:
    """Train, then write the model folder to `output`."""
    backend = backend or make_backend(config, plan.model)
    steps = []
    try:
        for epoch, batch in batches(plan.data, batch_size, epochs, config.seed):
            out = backend.forward_backward(batch, "cross_entropy", SFT_LOSS)
            done = backend.optim_step(adam_params(config.trainer))
            step = SftStep(done.step, epoch, out.loss, sum(d.num_loss_tokens for d in batch))
            steps.append(step)
            on_step(step)
        backend.export(output)
    finally:
        backend.close()
    return steps
