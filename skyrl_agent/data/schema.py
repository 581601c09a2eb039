"""The Parquet schema of stored trajectories: one row per trajectory, token arrays as list<int32>.

Nested columns (segments -> turns) are plain Arrow structs, so pyarrow, pandas and Hugging Face
`datasets` read the shards directly.

A segment's prompts extend each other (turn k+1's prompt starts with turn k's prompt and
completion), so a turn stores only the prompt ids it adds: its full prompt is the first
`prompt_shared` ids of the previous turn's prompt + completion, then `prompt_ids`. Stored whole,
a 50-turn episode would write its context 50 times over. Shards written before this have no
`prompt_shared` (whole prompts) and read the same.

Images (vision models) are stored once per trajectory, by content address, in `images`; a turn
lists only the images its added prompt ids show (`images`: sha256, offset, length), the
earlier ones being its history's. Shards without these columns read as image-free.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from skyrl_agent.types import (
    FailureKind,
    FinishReason,
    PlacedImage,
    Reward,
    RoutedExperts,
    Segment,
    Trajectory,
    Turn,
)

ROUTED_EXPERTS = pa.struct([
    ("start", pa.int32()), ("layers", pa.int16()), ("top_k", pa.int16()), ("width", pa.int8()),
    ("ids", pa.binary()),
])
"""R3 routing of a turn: the header and the packed expert ids (see types.RoutedExperts)."""

PLACED_IMAGE = pa.struct([("sha256", pa.string()), ("offset", pa.int32()),
                          ("length", pa.int32())])
"""Where a turn's prompt shows an image; its bytes are the trajectory's `images` entry."""
IMAGE = pa.struct([("sha256", pa.string()), ("data", pa.binary())])

TURN = pa.struct([
    ("prompt_ids", pa.list_(pa.int32())),
    ("prompt_shared", pa.int32()),
    ("completion_ids", pa.list_(pa.int32())),
    ("completion_logprobs", pa.list_(pa.float32())),
    ("loss_mask", pa.list_(pa.int8())),
    ("policy_version", pa.int64()),
    ("token_policy_versions", pa.list_(pa.int64())),
    ("versions_exact", pa.bool_()),
    ("finish_reason", pa.string()),
    ("started_at", pa.float64()),
    ("latency_s", pa.float64()),
    ("routed_experts", ROUTED_EXPERTS),
    ("images", pa.list_(PLACED_IMAGE)),
])
NUMBERS = pa.list_(pa.struct([("name", pa.string()), ("value", pa.float64())]))
"""A mapping of names to numbers as a list of (name, value) entries: Arrow's own map type is
not readable by Hugging Face `datasets`; this is, by pandas and pyarrow too."""
SEGMENT = pa.struct([("turns", pa.list_(TURN)), ("summary_turn_index", pa.int32())])
SCHEMA = pa.schema([
    ("task_id", pa.string()), ("sample_index", pa.int32()), ("agent", pa.string()),
    ("reward", pa.float64()), ("reward_components", NUMBERS),
    ("reward_reason", pa.string()), ("finish_reason", pa.string()), ("masked", pa.bool_()),
    ("mask_reason", pa.string()), ("failure", pa.string()), ("sandbox_time_s", pa.float64()),
    ("agent_time_s", pa.float64()), ("verify_time_s", pa.float64()),
    ("model_time_s", pa.float64()), ("exec_time_s", pa.float64()),
    ("handover_time_s", pa.float64()), ("stop_time_s", pa.float64()),
    ("framework_time_s", pa.float64()), ("total_time_s", pa.float64()),
    ("collect_time_s", pa.float64()),
    ("metrics", NUMBERS), ("segments", pa.list_(SEGMENT)), ("images", pa.list_(IMAGE)),
])
"""The time account (Trajectory.time_account) is one float column per bucket; framework_time_s
is derived, written for readers of the files, not read back. Shards written before these
columns existed read as zeros."""
TIME_COLUMNS = ("model_time_s", "exec_time_s", "handover_time_s", "stop_time_s",
                "total_time_s", "collect_time_s")
DERIVED_COLUMNS = ("framework_time_s", "images")
"""Columns computed from the others on write (no Trajectory field of their own); `images` holds
the bytes of the turns' images, each once."""


def _numbers(values: Mapping[str, float]) -> list[dict[str, Any]]:
    return [{"name": name, "value": float(value)} for name, value in values.items()]


def _mapping(entries: list[dict[str, Any]] | str) -> dict[str, float]:
    if isinstance(entries, str):  # shards written before maps were stored as numbers
        return {str(k): float(v) for k, v in json.loads(entries).items()}
    return {entry["name"]: entry["value"] for entry in entries}


def _turn_rows(turns: tuple[Turn, ...]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    history: tuple[int, ...] = ()
    seen: tuple[PlacedImage, ...] = ()
    for turn in turns:
        shared = len(history) if turn.prompt_ids[: len(history)] == history \
            and turn.images[: len(seen)] == seen else 0
        rows.append(_turn_row(turn, shared, len(seen) if shared else 0))
        history, seen = turn.prompt_ids + turn.completion_ids, turn.images
    return rows


def _turn_row(turn: Turn, shared: int, shared_images: int) -> dict[str, Any]:
    return {
        "images": [{"sha256": image.sha256, "offset": image.offset, "length": image.length}
                   for image in turn.images[shared_images:]],
        "prompt_ids": list(turn.prompt_ids[shared:]), "prompt_shared": shared,
        "completion_ids": list(turn.completion_ids),
        "completion_logprobs": list(turn.completion_logprobs), "loss_mask": list(turn.loss_mask),
        "policy_version": turn.policy_version,
        "token_policy_versions": None if turn.token_policy_versions is None
        else list(turn.token_policy_versions),
        "versions_exact": turn.versions_exact,
        "finish_reason": turn.finish_reason.value, "started_at": turn.started_at,
        "latency_s": turn.latency_s,
        "routed_experts": None if turn.routed_experts is None else {
            "start": turn.routed_experts.start, "layers": turn.routed_experts.layers,
            "top_k": turn.routed_experts.top_k, "width": turn.routed_experts.width,
            "ids": turn.routed_experts.ids}}


def to_row(t: Trajectory) -> dict[str, Any]:
    return {
        "task_id": t.task_id, "sample_index": t.sample_index, "agent": t.agent,
        "reward": t.reward.value, "reward_components": _numbers(t.reward.components),
        "reward_reason": t.reward.reason, "finish_reason": t.finish_reason.value,
        "masked": t.masked, "mask_reason": t.mask_reason,
        "failure": None if t.failure is None else t.failure.value,
        "sandbox_time_s": t.sandbox_time_s, "agent_time_s": t.agent_time_s,
        "verify_time_s": t.verify_time_s, "model_time_s": t.model_time_s,
        "exec_time_s": t.exec_time_s, "handover_time_s": t.handover_time_s,
        "stop_time_s": t.stop_time_s, "framework_time_s": t.framework_time_s,
        "total_time_s": t.total_time_s, "collect_time_s": t.collect_time_s,
        "metrics": _numbers(t.metrics),
        "segments": [{"turns": _turn_rows(s.turns),
                      "summary_turn_index": s.summary_turn_index} for s in t.segments],
        "images": [{"sha256": sha, "data": data} for sha, data in _image_bytes(t).items()]}


def _image_bytes(t: Trajectory) -> dict[str, bytes]:
    """Each distinct image of the trajectory once, by content address."""
    return {image.sha256: image.data for segment in t.segments for turn in segment.turns
            for image in turn.images}


def _turns(rows: list[dict[str, Any]], pictures: Mapping[str, bytes]) -> tuple[Turn, ...]:
    turns: list[Turn] = []
    history: tuple[int, ...] = ()
    seen: tuple[PlacedImage, ...] = ()
    for row in rows:
        shared = row.get("prompt_shared") or 0
        if not 0 <= shared <= len(history):
            raise ValueError(f"a turn shares {shared} ids with a history of {len(history)}")
        earlier = tuple(image for image in seen if image.end <= shared)
        turns.append(_turn(row, history[:shared], earlier + _placed(row, pictures)))
        history, seen = turns[-1].prompt_ids + turns[-1].completion_ids, turns[-1].images
    return tuple(turns)


def _placed(row: dict[str, Any], pictures: Mapping[str, bytes]) -> tuple[PlacedImage, ...]:
    placed = []
    for entry in row.get("images") or ():
        if entry["sha256"] not in pictures:
            raise ValueError(f"a turn shows image {entry['sha256'][:12]} the row does not hold")
        placed.append(PlacedImage(pictures[entry["sha256"]], entry["offset"], entry["length"]))
    return tuple(placed)


def _turn(row: dict[str, Any], shared: tuple[int, ...],
          images: tuple[PlacedImage, ...]) -> Turn:
    versions = row["token_policy_versions"]
    experts = row["routed_experts"]
    return Turn(images=images,
        prompt_ids=shared + tuple(row["prompt_ids"]),
        completion_ids=tuple(row["completion_ids"]),
        completion_logprobs=tuple(row["completion_logprobs"]),
        loss_mask=tuple(row["loss_mask"]), policy_version=row["policy_version"],
        finish_reason=FinishReason(row["finish_reason"]), started_at=row["started_at"],
        latency_s=row["latency_s"],
        routed_experts=_routed_experts(experts),
        token_policy_versions=None if versions is None else tuple(versions),
        versions_exact=bool(row.get("versions_exact")))  # shards before it: False


def _routed_experts(value: Any) -> RoutedExperts | None:
    if not isinstance(value, dict):  # none recorded (older shards held an unused list column)
        return None
    return RoutedExperts(value["start"], value["layers"], value["top_k"], value["ids"],
                         value["width"])


def from_row(row: dict[str, Any]) -> Trajectory:
    reward = Reward(value=row["reward"], components=_mapping(row["reward_components"]),
                    reason=row["reward_reason"], verify_time_s=row["verify_time_s"])
    pictures = {entry["sha256"]: entry["data"] for entry in row.get("images") or ()}
    segments = tuple(Segment(_turns(s["turns"], pictures), s["summary_turn_index"])
                     for s in row["segments"])
    return Trajectory(
        task_id=row["task_id"], sample_index=row["sample_index"], agent=row["agent"],
        segments=segments, reward=reward, finish_reason=FinishReason(row["finish_reason"]),
        masked=row["masked"], mask_reason=row["mask_reason"],
        failure=None if row.get("failure") is None else FailureKind(row["failure"]),
        sandbox_time_s=row["sandbox_time_s"], agent_time_s=row["agent_time_s"],
        verify_time_s=row["verify_time_s"], metrics=_mapping(row["metrics"]),
        **{name: row.get(name) or 0.0 for name in TIME_COLUMNS})


def to_table(trajectories: list[Trajectory]) -> pa.Table:
    return pa.Table.from_pylist([to_row(t) for t in trajectories], schema=SCHEMA)
