"""Demonstrations: a task's reference solution acted out by an agent, recorded like any sample.

For each task the agent's own reply format is filled with the solution's commands
(`Agent.demonstration`), a scripted teacher (agents/teacher.py) serves those replies to a real
LLMSession, and the real agent runs them in a sandbox; the episode is verified as usual. Only
demonstrations that score 1 with consistent token arrays are kept, in a run dir `sft --data`
reads (the job: jobs/demos.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skyrl_agent.agents.base import Agent, agent_class
from skyrl_agent.agents.teacher import Teacher
from skyrl_agent.collector.model_access import session_config
from skyrl_agent.collector.one_sample import make_agent, run_rollout
from skyrl_agent.config import RunConfig
from skyrl_agent.envs.episode import SandboxSource, fresh_sandboxes
from skyrl_agent.llm.session import LLMSession
from skyrl_agent.model.vision import tokenizer_images
from skyrl_agent.tasks.families.base import Step
from skyrl_agent.tasks.solution import solution_commands, solution_plan, solution_walkthrough
from skyrl_agent.tasks.spec import TaskSpec
from skyrl_agent.types import Trajectory

DEMO_SAMPLE = 0
"""The sample index of a task's demonstration (one per task)."""


def token_problem(trajectory: Trajectory) -> str | None:
    """What breaks the token-consistency rules of recorded trajectories (None: nothing): every
    segment's prompts extend the previous prompt + completion, every turn sampled something,
    its mask is 0/1 and trains at least one token."""
    if not trajectory.segments:
        return "no model turns"
    for number, segment in enumerate(trajectory.segments):
        if not segment.turns:
            return f"segment {number} has no turns"
        if not segment.is_token_consistent():
            return f"segment {number}: a prompt does not extend the turn before it"
        for turn in segment.turns:
            if not turn.completion_ids:
                return f"segment {number}: an empty completion"
            if set(turn.loss_mask) - {0, 1} or not any(turn.loss_mask):
                return f"segment {number}: a loss mask that is not 0/1 or trains nothing"
    return None


def rejection(trajectory: Trajectory, min_reward: float = 1.0) -> str | None:
    """Why a trajectory is not kept as a demonstration (None: keep it)."""
    if trajectory.metrics.get("teacher_truncated", 0.0) > 0:
        return "a reply is longer than inference.max_tokens"
    if trajectory.masked:
        return f"masked: {trajectory.mask_reason}"
    if trajectory.reward.value < min_reward:
        why = f" ({trajectory.reward.reason})" if trajectory.reward.reason else ""
        return f"reward {trajectory.reward.value:g}{why}"
    return token_problem(trajectory)


@dataclass(frozen=True)
class DemoScript:
    """What a teacher says in one demonstration."""

    replies: list[str]
    """The agent's replies, in order."""
    summaries: list[str] = field(default_factory=list)
    """The summary to give when the session asks for one after k replies, by k (a walkthrough
    has them; a one-turn solution never fills the context)."""


def demo_script(agent_cls: type[Agent], task: TaskSpec) -> DemoScript:
    """The agent's replies that carry out the task's reference solution: its walkthrough, step
    by step with summaries, when it has one; else its solve.sh in one go."""
    plan = solution_plan(task)
    steps = solution_walkthrough(task)
    if not steps:
        return DemoScript(agent_cls.demonstration(solution_commands(task), plan))
    return DemoScript(agent_cls.walkthrough(steps, plan), walkthrough_summaries(steps))


def walkthrough_summaries(steps: Sequence[Step]) -> list[str]:
    """The teacher's summary after k replies, by k: what the steps whose output the model has
    seen found (their `carry`), and the step whose output comes next. A summary is asked for
    before the pending observation (the last step's output) is shown, so after k replies it
    holds the first k - 1 steps. The credit rule is the trajectory's: a summary turn is
    trained with the advantage of the trajectory it belongs to, like every other turn."""
    summaries = []
    for replies in range(len(steps) + 1):
        seen = steps[: max(replies - 1, 0)]
        found = "; ".join(step.carry or step.finding for step in seen) or "nothing yet"
        last = (f" Last command: `{'; '.join(steps[replies - 1].commands)}`; its output "
                "follows." if replies else "")
        summaries.append(f"Progress so far: {found}.{last}")
    return summaries


async def act_out(task: TaskSpec, agent_cls: type[Agent], config: RunConfig, tokenizer: Any,
                  script: DemoScript | Sequence[str | Sequence[int]], sandboxes: SandboxSource,
                  keep_state: Path | None = None, sample_index: int = DEMO_SAMPLE) -> Trajectory:
    """One episode of the real agent whose session is served by a teacher with `script` (or
    plain replies: a replay's sampled ids, summaries included in their order)."""
    settings = session_config(config, None)
    if isinstance(script, DemoScript):
        teacher = Teacher(tokenizer, script.replies, script.summaries, settings.summary_prompt)
    else:
        teacher = Teacher(tokenizer, script)

    images = tokenizer_images(tokenizer)

    def sessions(agent: Agent, session_id: str) -> LLMSession:
        return LLMSession(teacher, tokenizer, settings, tools=agent.tools_for(images is not None),
                          session_id=session_id, images=images)

    trajectory = await run_rollout(task, sample_index, make_agent(agent_cls, config), config,
                                   sessions, keep_state, sandboxes)
    metrics = {**trajectory.metrics, "demonstration": 1.0,
               "teacher_truncated": float(teacher.truncated)}
    return dataclasses.replace(trajectory, metrics=metrics)


async def replay(trajectory: Trajectory, task: TaskSpec, config: RunConfig,
                 tokenizer: Any) -> Trajectory:
    """Act a stored trajectory out again from its own sampled ids, in fresh sandboxes."""
    replies = [turn.completion_ids for segment in trajectory.segments for turn in segment.turns]
    return await act_out(task, agent_class(trajectory.agent), config, tokenizer, replies,
                         fresh_sandboxes(config.sandbox), sample_index=trajectory.sample_index)


def load_tokenizer(config: RunConfig) -> Any:
    from transformers import AutoTokenizer

    from skyrl_agent.model.names import resolve_model
    return AutoTokenizer.from_pretrained(resolve_model(config.inference.model))
