"""Trajectories as plain JSON-ready data, and back (for run directories and exports)."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from skyrl_agent.types import FinishReason, Reward, Segment, Trajectory, Turn


def to_plain(value: Any) -> Any:
    """Dataclasses, mappings, tuples and enums as dicts, lists and strings."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_plain(v) for v in value]
    return value


def _tuple(values: Any) -> tuple | None:
    return None if values is None else tuple(values)


def turn_from_plain(data: dict[str, Any]) -> Turn:
    return Turn(
        prompt_ids=tuple(data["prompt_ids"]), completion_ids=tuple(data["completion_ids"]),
        completion_logprobs=tuple(data["completion_logprobs"]),
        loss_mask=tuple(data["loss_mask"]), policy_version=data["policy_version"],
        finish_reason=FinishReason(data["finish_reason"]), started_at=data["started_at"],
        latency_s=data["latency_s"],
        routed_experts=None if data.get("routed_experts") is None
        else tuple(tuple(e) for e in data["routed_experts"]),
        token_policy_versions=_tuple(data.get("token_policy_versions")))


def trajectory_from_plain(data: dict[str, Any]) -> Trajectory:
    segments = tuple(Segment(tuple(turn_from_plain(t) for t in s["turns"]),
                             s.get("summary_turn_index")) for s in data["segments"])
    reward = Reward(**{**data["reward"], "components": dict(data["reward"]["components"])})
    return Trajectory(
        task_id=data["task_id"], sample_index=data["sample_index"], agent=data["agent"],
        segments=segments, reward=reward, finish_reason=FinishReason(data["finish_reason"]),
        masked=data["masked"], mask_reason=data["mask_reason"],
        sandbox_time_s=data["sandbox_time_s"], agent_time_s=data["agent_time_s"],
        verify_time_s=data["verify_time_s"], metrics=dict(data["metrics"]))
