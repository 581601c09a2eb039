"""Export of stored trajectories in Harbor's ATIF format, built with harbor's own models.

Each model call becomes a `user` step (the text newly added to the prompt: the task, an
observation, a summary request) followed by an `agent` step (the sampled text), whose metrics
carry the exact prompt ids, completion ids and logprobs.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path

from harbor.models.trajectories import Agent, FinalMetrics, Metrics, Step
from harbor.models.trajectories import Trajectory as AtifTrajectory

from skyrl_agent import __version__
from skyrl_agent.data.run_dir import sample_stem
from skyrl_agent.types import Trajectory

Decode = Callable[[tuple[int, ...]], str]


def to_atif(trajectory: Trajectory, decode: Decode, model_name: str | None) -> AtifTrajectory:
    steps: list[Step] = []
    for segment_index, segment in enumerate(trajectory.segments):
        for turn, new_input in zip(segment.turns, segment.new_inputs(), strict=True):
            when = datetime.datetime.fromtimestamp(turn.started_at, datetime.UTC).isoformat()
            steps.append(Step(step_id=len(steps) + 1, source="user", timestamp=when,
                              message=decode(new_input),
                              extra={"segment": segment_index}))
            steps.append(Step(
                step_id=len(steps) + 1, source="agent", model_name=model_name,
                message=decode(turn.completion_ids),
                metrics=Metrics(prompt_tokens=len(turn.prompt_ids),
                                completion_tokens=len(turn.completion_ids),
                                prompt_token_ids=list(turn.prompt_ids),
                                completion_token_ids=list(turn.completion_ids),
                                logprobs=list(turn.completion_logprobs)),
                extra={"policy_version": turn.policy_version,
                       "finish_reason": turn.finish_reason.value}))
    turns = [t for s in trajectory.segments for t in s.turns]
    if not steps:  # ATIF needs a step; agents like oracle make no model calls
        steps.append(Step(step_id=1, source="system",
                          message=f"agent {trajectory.agent!r} made no model calls"))
    return AtifTrajectory(
        session_id=f"{trajectory.task_id}#{trajectory.sample_index}",
        agent=Agent(name=trajectory.agent, version=__version__, model_name=model_name),
        steps=steps,
        final_metrics=FinalMetrics(
            total_prompt_tokens=sum(len(t.prompt_ids) for t in turns),
            total_completion_tokens=sum(len(t.completion_ids) for t in turns),
            total_steps=len(steps),
            extra={"reward": trajectory.reward.value, "finish_reason":
                   trajectory.finish_reason.value, "masked": trajectory.masked,
                   "mask_reason": trajectory.mask_reason}))


def export_atif(trajectories: list[Trajectory], folder: Path, decode: Decode,
                model_name: str | None) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for trajectory in trajectories:
        path = folder / f"{sample_stem(trajectory.task_id, trajectory.sample_index)}.json"
        path.write_text(to_atif(trajectory, decode, model_name).model_dump_json(
            indent=2, exclude_none=True))
        paths.append(path)
    return paths
