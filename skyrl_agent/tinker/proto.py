"""The SDK's protobuf messages, to and from the trainer's types.

Requests: `ForwardBackwardRequest` (tokens as int32 bytes per chunk, named tensors as dense
bytes; the SDK sends target_tokens as int64, kept as ints: a float tensor there is refused).
Results: `ForwardBackwardOutput` (per-datum `logprobs` in one batched float32 record) and
`SampleResponse` (tokens int32, logprobs float32, prompt logprobs with NaN first). The
message classes come from the installed `tinker` package (extra `tinker`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from skyrl_agent.backends.backend import DATUM_ARRAYS, INTEGER_ARRAYS, Datum
from skyrl_agent.backends.loss import LOSS_FNS
from skyrl_agent.errors import ConfigError
from skyrl_agent.tinker.errors import TinkerUserError
from skyrl_agent.tinker.images import IMAGE_SLOT
from skyrl_agent.types import PlacedImage


def public_pb() -> Any:
    """The SDK's generated protobuf module (tinker_public_pb2)."""
    try:
        from tinker.proto import tinker_public_pb2
    except ImportError:
        raise ConfigError("tinker-serve needs the tinker SDK's protobuf messages: "
                          "pip install 'skyrl-agent[tinker]'") from None
    return tinker_public_pb2


@dataclass(frozen=True)
class ForwardBackwardCall:
    """One decoded forward_backward (or forward) request."""

    model_id: str
    seq_id: int | None
    loss_fn: str
    loss_fn_config: Mapping[str, float | str]
    forward_only: bool
    data: tuple[Datum, ...]


def decode_forward_backward(body: bytes, zstd: bool = False,
                            max_bytes: int = 1 << 30) -> ForwardBackwardCall:
    """A ForwardBackwardRequest; a malformed body or datum is the caller's error. A compressed
    body may not grow past `max_bytes` (the limit on plain bodies): a small zstd bomb would
    otherwise take gigabytes."""
    pb = public_pb()
    if zstd:
        body = _unzstd(body, max_bytes)
    message = pb.ForwardBackwardRequest()
    try:
        message.ParseFromString(body)
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise TinkerUserError(f"body is not a ForwardBackwardRequest: {exc}") from None
    if message.loss_fn not in LOSS_FNS and not message.forward_only:
        raise TinkerUserError(f"unknown loss_fn {message.loss_fn!r}; this server supports "
                              f"{', '.join(LOSS_FNS)}")
    config: dict[str, float | str] = {k: float(v) for k, v in message.loss_fn_config.items()}
    for key, value in message.loss_fn_config_v2.items():
        config[key] = value.text if value.WhichOneof("value") == "text" else float(value.number)
    data = tuple(_datum(pb, d, i, message.loss_fn) for i, d in enumerate(message.data))
    return ForwardBackwardCall(message.model_id, message.seq_id or None, message.loss_fn,
                               config, message.forward_only, data)


def _datum(pb: Any, message: Any, index: int, loss_fn: str) -> Datum:
    tokens: list[int] = []
    images: list[PlacedImage] = []
    for chunk in message.model_input:
        kind = chunk.WhichOneof("chunk")
        if kind == "image":
            images.append(_image(chunk.image, len(tokens), index))
            tokens.extend([IMAGE_SLOT] * images[-1].length)
            continue
        if kind != "encoded_text":
            raise TinkerUserError(f"datum {index}: only text and image chunks are supported, "
                                  f"not {kind}")
        tokens.extend(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist())
    arrays = {name: _tensor(pb, tensor, f"datum {index}: {name}", name in INTEGER_ARRAYS)
              for name, tensor in message.loss_fn_inputs.items()}
    ratio_mask = arrays.pop("sequence_ratio_mask", None)
    if ratio_mask is not None and loss_fn != "gspo":
        raise TinkerUserError(f"datum {index}: sequence_ratio_mask applies to gspo only")
    unknown = set(arrays) - set(DATUM_ARRAYS)
    if unknown:
        raise TinkerUserError(f"datum {index}: unknown loss_fn_inputs {sorted(unknown)}; "
                              f"known: {', '.join(DATUM_ARRAYS)}")
    if "target_tokens" not in arrays:
        raise TinkerUserError(f"datum {index}: loss_fn_inputs needs target_tokens")
    if loss_fn != "cross_entropy" and "advantages" not in arrays:
        raise TinkerUserError(f"datum {index}: {loss_fn} needs advantages and logprobs")
    if "weights" not in arrays:
        arrays["weights"] = _default_weights(loss_fn, arrays, ratio_mask, len(tokens))
    try:
        return Datum(tuple(tokens), arrays, images=tuple(images))
    except ValueError as exc:
        raise TinkerUserError(f"datum {index}: {exc}") from None


def _image(message: Any, offset: int, index: int) -> PlacedImage:
    """An image chunk of a datum: its positions are part of the datum's arrays, so it must say
    how many it takes."""
    if not message.HasField("expected_tokens") or message.expected_tokens < 1:
        raise TinkerUserError(f"datum {index}: an image chunk needs expected_tokens (the "
                              "datum's arrays cover its positions)")
    return PlacedImage(bytes(message.data), offset, message.expected_tokens)


def _default_weights(loss_fn: str, arrays: Mapping[str, tuple[float, ...]],
                     ratio_mask: tuple[float, ...] | None, length: int) -> tuple[float, ...]:
    """Tinker's losses sum over every position unless weights say otherwise. A position with
    advantage 0 adds nothing to a policy loss, in value or gradient, so for those losses only
    the positions with an advantage get weight 1: the same loss, and per-token metrics
    (agreement, clip fractions) that describe the trained tokens, not the prompt. GSPO's
    sequence ratio runs over `sequence_ratio_mask` (the cookbook sends it). DRO's quadratic
    term counts everywhere, as in Tinker."""
    if ratio_mask is not None:
        return ratio_mask
    if loss_fn in ("cross_entropy", "dro") or "advantages" not in arrays:
        return (1.0,) * length
    return tuple(1.0 if a != 0 else 0.0 for a in arrays["advantages"])


def _tensor(pb: Any, tensor: Any, what: str,
            integer: bool = False) -> tuple[int, ...] | tuple[float, ...]:
    """A dense 1-D tensor's values: ints for an integer array (token ids, versions; a float
    tensor there is refused, never rounded), else floats."""
    dtypes = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}
    if tensor.dtype not in dtypes:
        raise TinkerUserError(f"{what}: unsupported dtype {tensor.dtype}")
    if tensor.WhichOneof("encoding") != "dense":
        raise TinkerUserError(f"{what}: only dense tensors are supported")
    values = np.frombuffer(tensor.dense, dtype=dtypes[tensor.dtype])
    if len(tensor.shape) > 1:
        raise TinkerUserError(f"{what}: expected one value per position, got shape "
                              f"{list(tensor.shape)}")
    if integer:
        if values.dtype.kind != "i":
            raise TinkerUserError(f"{what}: must be an integer tensor (int64 or int32), not "
                                  f"{values.dtype}")
        return tuple(values.tolist())
    if not np.all(np.isfinite(values)):
        raise TinkerUserError(f"{what}: values must be finite")
    return tuple(values.astype(np.float64).tolist())


def encode_forward_backward(logprobs: Sequence[Sequence[float]],
                            metrics: Mapping[str, float]) -> bytes:
    """A ForwardBackwardOutput: per-datum logprobs and `name:reduction` metrics."""
    pb = public_pb()
    flat = np.concatenate([np.asarray(row, dtype=np.float32) for row in logprobs]) \
        if logprobs else np.zeros(0, dtype=np.float32)
    offsets = np.cumsum([0, *(len(row) * 4 for row in logprobs)], dtype=np.int64)
    record = pb.ArrayRecord(type_tag="ArrayRecord", num_datums=len(logprobs))
    record.fields["logprobs"].CopyFrom(pb.BatchedTensor(
        data=flat.tobytes(), offsets=offsets.tobytes(), dtype=pb.DTYPE_FLOAT32))
    message = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord",
                                       loss_fn_outputs=[record], metrics=dict(metrics))
    return bytes(message.SerializeToString())


@dataclass(frozen=True)
class SampledSequence:
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    stop_reason: str
    """stop or length."""


def encode_sample(sequences: Sequence[SampledSequence],
                  prompt_logprobs: Sequence[float] | None,
                  topk: tuple[np.ndarray, np.ndarray] | None = None,
                  cached_tokens: int = 0) -> bytes:
    """A SampleResponse: sampled tokens and logprobs, and prompt logprobs (top-k too) if
    asked."""
    pb = public_pb()
    reasons = {"stop": pb.STOP_REASON_STOP, "length": pb.STOP_REASON_LENGTH}
    message = pb.SampleResponse(prompt_cache_hit_tokens=cached_tokens)
    for seq in sequences:
        message.sequences.add(tokens=np.asarray(seq.tokens, dtype=np.int32).tobytes(),
                              logprobs=np.asarray(seq.logprobs, dtype=np.float32).tobytes(),
                              stop_reason=reasons[seq.stop_reason])
    if prompt_logprobs is not None:
        message.prompt_logprobs = np.asarray(
            [math.nan if v is None else v for v in prompt_logprobs], dtype=np.float32).tobytes()
    if topk is not None:
        ids, logprobs = topk
        message.topk_prompt_logprobs.CopyFrom(pb.TopkLogprobs(
            token_ids=np.ascontiguousarray(ids, dtype=np.int32).tobytes(),
            logprobs=np.ascontiguousarray(logprobs, dtype=np.float32).tobytes(),
            k=int(ids.shape[1]), length=int(ids.shape[0])))
    return bytes(message.SerializeToString())


def _unzstd(body: bytes, max_bytes: int) -> bytes:
    import zstandard

    try:
        # A stream reader never trusts the size a frame header claims.
        with zstandard.ZstdDecompressor().stream_reader(body) as reader:
            plain = reader.read(max_bytes + 1)
    except zstandard.ZstdError as exc:
        raise TinkerUserError(f"bad zstd body: {exc}") from None
    if len(plain) > max_bytes:
        raise TinkerUserError(f"the decompressed body is over {max_bytes} bytes")
    return plain
