"""The training operations, each run on the worker thread in its model's seq_id order.

Every operation is a plain function of one TrainingModel that returns the future's Result: the
protobuf ForwardBackwardOutput, or the JSON the SDK's response types read.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence

from skyrl_agent.atomic import atomic_folder
from skyrl_agent.backends.backend import AdamParams, Datum
from skyrl_agent.backends.passes import forward_loss
from skyrl_agent.tinker.catalog import Catalog
from skyrl_agent.tinker.errors import TinkerUserError
from skyrl_agent.tinker.futures import Result
from skyrl_agent.tinker.images import with_image_tokens
from skyrl_agent.tinker.losses import loss_config
from skyrl_agent.tinker.models import TrainingModel
from skyrl_agent.tinker.proto import ForwardBackwardCall, encode_forward_backward
from skyrl_agent.tinker.store import (
    Checkpoint,
    ModelSpec,
    SamplerRef,
    Store,
    write_spec,
)

MAX_REDUCTIONS = ("agreement/max_abs_diff", "off_policy/max_abs_diff")
SUM_METRICS = ("loss", "tokens")


def tinker_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """Metric names as the SDK merges them across chunks: `name:reduction`."""
    out: dict[str, float] = {}
    for name, value in metrics.items():
        clean = name.replace(":", "_")
        reduction = "sum" if name in SUM_METRICS else "max" if name in MAX_REDUCTIONS else "mean"
        out[f"{clean}:{reduction}"] = float(value)
    return out


def forward_backward(model: TrainingModel, call: ForwardBackwardCall) -> Result:
    if not call.data:
        raise TinkerUserError("forward_backward needs at least one datum")
    data = with_image_tokens(call.data, model.base.folder, model.base.name)
    check_tokens(data, model.base.vocab_size)
    config = loss_config(call.loss_fn, call.loss_fn_config)
    if call.forward_only:  # Tinker's forward reports the loss too, without a gradient
        try:
            logprobs = model.backend.forward(data)
            metrics = forward_loss(data, logprobs, call.loss_fn, config)
        except ValueError as exc:
            raise TinkerUserError(str(exc)) from None
        return Result(proto=encode_forward_backward(logprobs, tinker_metrics(metrics)))
    try:
        output = model.backend.forward_backward(data, call.loss_fn, config)
    except ValueError as exc:  # token ids outside the vocabulary, KL without a reference, ...
        raise TinkerUserError(str(exc)) from None
    return Result(proto=encode_forward_backward(output.logprobs, tinker_metrics(output.metrics)))


def check_tokens(data: Sequence[Datum], vocab_size: int) -> None:
    """Every input and target id inside the vocabulary (else torch fails deep inside)."""
    for index, datum in enumerate(data):
        ids = [*datum.model_input, *(datum.integers("target_tokens") or ())]
        bad = next((t for t in ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise TinkerUserError(f"datum {index}: token id {bad} is outside the "
                                  f"vocabulary (0..{vocab_size - 1})")


def optim_step(model: TrainingModel, adam: AdamParams) -> Result:
    output = model.backend.optim_step(adam)
    metrics = {**output.metrics, "step": float(output.step)}
    return Result(json={"metrics": metrics, "type": "optim_step"})


def save_state(model: TrainingModel, store: Store, name: str | None, overwrite: bool,
               ttl_seconds: int | None) -> Result:
    name = name or f"state-{model.backend.step:06d}"
    folder, tinker_path = store.new_checkpoint(model.model_id, "weights", name, overwrite)
    # save_state replaces the folder atomically; spec.json, written last, marks it complete.
    model.backend.save_state(folder)
    Catalog.expire(folder, ttl_seconds)
    write_spec(folder, model.spec)
    return Result(json={"path": tinker_path, "type": "save_weights"})


def load_state(model: TrainingModel, checkpoint: Checkpoint, optimizer: bool) -> Result:
    if checkpoint.spec != model.spec:
        raise TinkerUserError(
            f"{checkpoint.tinker_path} was saved by a {describe(checkpoint.spec)} model; "
            f"{model.model_id} is a {describe(model.spec)} model")
    try:
        model.backend.load_state(checkpoint.path, optimizer=optimizer)
    except (ValueError, OSError) as exc:
        raise TinkerUserError(f"cannot load {checkpoint.tinker_path}: {exc}") from None
    return Result(json={"path": checkpoint.tinker_path, "model_id": model.model_id,
                        "type": "load_weights"})


def save_for_sampler(model: TrainingModel, store: Store, name: str | None,
                     sampling_session_id: str | None, ttl_seconds: int | None) -> Result:
    """Named: a tinker:// sampler checkpoint. Ephemeral: a sampling session on a snapshot."""
    model.saves += 1
    update = model.backend.save_weights_for_sampler(model.saves)
    if name is not None:
        folder, tinker_path = store.new_checkpoint(model.model_id, "sampler_weights", name)
    else:
        folder, tinker_path = store.ephemeral_sampler(model.model_id), None
    with atomic_folder(folder, replace=True) as staging:
        # A copy: the backend rewrites its file in place at the next save (and, in full
        # fine-tuning on CPU, at every optimizer step).
        shutil.copyfile(update.path, staging / "weights.safetensors")
        if tinker_path is not None:
            Catalog.expire(staging, ttl_seconds)
        write_spec(staging, model.spec)
    if tinker_path is not None:
        return Result(json={"path": tinker_path, "type": "save_weights_for_sampler"})
    if sampling_session_id is None:
        raise TinkerUserError("save_weights_for_sampler needs a path or a sampling_session_seq_id")
    store.save_session(sampling_session_id, SamplerRef(
        base_model=model.spec.base_model, weights=str(folder / "weights.safetensors"),
        owner=model.owner))
    return Result(json={"sampling_session_id": sampling_session_id,
                        "type": "save_weights_for_sampler"})


def describe(spec: ModelSpec) -> str:
    shape = f"LoRA rank {spec.lora_rank}" if spec.lora_rank else "full fine-tuning"
    return f"{spec.base_model} ({shape})"
