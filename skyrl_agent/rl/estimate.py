"""How long a training step will take, said before the first one starts.

Tokens per step come from the budgets (at most `max_turns x max_tokens` sampled per sample) or,
when a run of the same model, trainer, agent, tasks and budgets has run on this machine, from
what its samples really sampled. Seconds come from what was measured here, remembered in the
cache after every training step (`remember`): per sample, the seconds the trainer waited for
samples and the seconds it trained. With no run remembered yet, a short calibration (one
forward and backward pass of a sequence as long as the context, in the run's trainer) bounds
the training part alone: a sample costs at most that when its conversation fills the context.
A calibration is kept per model, trainer and context, for every workload not yet measured.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from skyrl_agent.atomic import atomic_write_text
from skyrl_agent.config import RunConfig, cache_dir

WARN_AFTER_S = 180.0
"""A plan warns when a step is estimated to take longer than this."""


@dataclass(frozen=True)
class Rates:
    """Measured on this machine for one model and trainer setting, per sample."""

    train_s: float
    """Seconds of training (forward, backward, optimizer step) per sample."""
    wait_s: float | None = None
    """Seconds the trainer waited for samples, per sample (None: not measured)."""
    tokens: float | None = None
    """Tokens a sample really sampled (None: not measured; the budget bounds it)."""
    source: str = ""
    """Where the numbers come from (a run's step, or a calibration)."""


@dataclass(frozen=True)
class StepEstimate:
    samples: int
    tokens: int
    """Tokens sampled (and trained) a step: measured per sample, or the budget's bound."""
    bound: bool
    """True when `tokens` is the budget's upper bound rather than a measured mean."""
    seconds: float | None
    """Estimated seconds a step (sampling included only when measured); None: no rates."""
    rates: Rates | None

    def lines(self) -> list[str]:
        tokens = f"{'up to ' if self.bound else 'about '}{self.tokens:,} tokens sampled and trained"
        if self.seconds is None or self.rates is None:
            return [f"a step: {self.samples} samples, {tokens}; no step measured here yet "
                    "(`train --dry-run` calibrates the torch trainer)"]
        part = "" if self.rates.wait_s is not None else " (training only, at most)"
        line = (f"a step: {self.samples} samples, {tokens}; about {_duration(self.seconds)}"
                f"{part} on this machine ({self.rates.source})")
        if self.seconds <= WARN_AFTER_S:
            return [line]
        return [line, f"warning: a step may take {_duration(self.seconds)} here; fewer groups "
                      "or samples, LoRA (trainer.lora_rank), or shorter budgets make it shorter"]


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def rates_path(config: RunConfig, model_folder: Path) -> Path:
    """Where a run's measured rates are remembered on this machine: per model and trainer
    setting, and per workload (agent, tasks, budgets, server), since a sample's tokens and
    waiting depend on all of them."""
    agent = config.agent
    return _rates_file(config, model_folder, agent.name, config.tasks.source, agent.max_turns,
                       agent.max_context_tokens, config.inference.max_tokens,
                       config.inference.endpoint)


def calibration_path(config: RunConfig, model_folder: Path) -> Path:
    """Where a calibration is remembered: it bounds training alone, which depends only on the
    model, the trainer setting and the context."""
    return _rates_file(config, model_folder, "calibration", config.agent.max_context_tokens)


def _rates_file(config: RunConfig, model_folder: Path, *workload: object) -> Path:
    trainer = config.trainer
    key = json.dumps([str(model_folder.resolve()), trainer.backend, trainer.lora_rank,
                      trainer.dtype, trainer.data_parallel, trainer.tensor_parallel, *workload])
    return cache_dir() / "step-rates" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def remembered(config: RunConfig, model_folder: Path) -> Rates | None:
    """This workload's measured rates, else a calibration of its model and trainer."""
    for path in (rates_path(config, model_folder), calibration_path(config, model_folder)):
        try:
            return Rates(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue  # none yet, or unreadable: measured again
    return None


def remember(config: RunConfig, model_folder: Path, metrics: Mapping[str, float],
             samples: int, where: str) -> None:
    """Keep a finished step's costs for the next plan (a step that trained nothing is not
    a measurement)."""
    if metrics.get("tokens", 0.0) <= 0 or samples <= 0:
        return
    _write(rates_path(config, model_folder), Rates(
        train_s=metrics.get("train_s", 0.0) / samples,
        wait_s=metrics.get("wait_s", 0.0) / samples,
        tokens=metrics.get("sampled_tokens", 0.0) / samples, source=where))


def _write(path: Path, rates: Rates) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(asdict(rates)))


CALIBRATION_TOKENS = (128, 384)
"""The calibration passes' lengths: their time difference is the cost per token, scaled to the
context (a pass's fixed cost is shared by the samples packed together in a real step)."""


def calibrate(config: RunConfig, model_folder: Path) -> Rates | None:
    """Training seconds of a sample that fills the context, from the per-token cost of two
    forward and backward passes of different lengths (the torch trainer only: the sharded ones
    start processes)."""
    if config.trainer.backend != "torch":
        return None
    from skyrl_agent.backends.build import build_backend, lora_settings

    context = config.agent.max_context_tokens
    backend = build_backend(model_folder, config.trainer, lora_settings(config.trainer),
                            config.seed)
    try:
        _timed_pass(backend, CALIBRATION_TOKENS[0])  # the first pass warms up
        short, long = (_timed_pass(backend, length) for length in CALIBRATION_TOKENS)
    finally:
        backend.close()
    per_token = (long - short) / (CALIBRATION_TOKENS[1] - CALIBRATION_TOKENS[0])
    if per_token <= 0:  # noise larger than the difference: the long pass bounds it
        per_token = long / CALIBRATION_TOKENS[1]
    return Rates(train_s=per_token * context,
                 source=f"calibration passes scaled to the {context}-token context")


def _timed_pass(backend: Any, length: int) -> float:
    from skyrl_agent.backends.backend import Datum

    datum = Datum(model_input=(1,) * length,
                  loss_fn_inputs={"target_tokens": (1,) * length, "weights": (1.0,) * length})
    started = time.perf_counter()
    backend.forward_backward([datum], "cross_entropy")
    return time.perf_counter() - started


def estimate_step(config: RunConfig, model_folder: Path, samples: int,
                  measure: bool) -> StepEstimate:
    """The next step's tokens and seconds, from remembered costs, else (with `measure`) a
    calibration, which is then remembered too."""
    rates = remembered(config, model_folder)
    if rates is None and measure:
        rates = calibrate(config, model_folder)
        if rates is not None:
            _write(calibration_path(config, model_folder), rates)
    per_sample: float = config.agent.max_turns * config.inference.max_tokens
    if config.agent.max_sampled_tokens is not None:
        per_sample = min(per_sample, config.agent.max_sampled_tokens)
    measured = rates is not None and rates.tokens is not None
    if measured:
        per_sample = rates.tokens  # type: ignore[union-attr,assignment]
    seconds = None if rates is None else samples * (rates.train_s + (rates.wait_s or 0.0))
    return StepEstimate(samples, int(samples * per_sample), not measured, seconds, rates)
