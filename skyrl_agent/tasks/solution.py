"""A task's reference solution as shell commands one would type, one after another.

Demonstrations turn these into an agent's replies. solve.sh loses its shebang, its `set -e...`
lines (in an interactive shell they would end the shell at the first failing command), comments
and blank lines; a line continued with a backslash, or a here-document, stays with its command.
"""

from __future__ import annotations

import re

from skyrl_agent.errors import TaskError
from skyrl_agent.tasks.families.base import Step
from skyrl_agent.tasks.files import read_task_text
from skyrl_agent.tasks.spec import TaskSpec

_HEREDOC = re.compile(r"<<(-?)\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\2")
DEFAULT_PLAN = "Run the commands that solve the task."
"""The plan of a demonstration when the task names none (`[metadata] plan`)."""


def split_commands(script: str) -> list[str]:
    """Top-level commands of a bash script, in order (see the module docstring)."""
    lines = script.splitlines()
    if lines and lines[0].startswith("#!"):
        lines = lines[1:]
    commands: list[str] = []
    current: list[str] = []
    pending: list[tuple[bool, str]] = []  # here-document terminators still to come
    for line in lines:
        if pending:
            current.append(line)
            strip_tabs, word = pending[0]
            if (line.lstrip("\t") if strip_tabs else line) == word:
                pending.pop(0)
        else:
            stripped = line.strip()
            if not current and (not stripped or stripped.startswith("#")
                                or re.match(r"set\s+[-+]", stripped)):
                continue
            current.append(line)
            pending = [(dash == "-", word) for dash, _, word in _HEREDOC.findall(line)]
            if line.endswith("\\"):
                continue
        if not pending and current and not current[-1].endswith("\\"):
            commands.append("\n".join(current))
            current = []
    if current:
        commands.append("\n".join(current))
    return commands


def solution_commands(task: TaskSpec) -> list[str]:
    """The commands of the task's solution/solve.sh; TaskError when it has none."""
    script = task.solution_dir / "solve.sh"
    if not script.is_file():
        raise TaskError(f"task {task.name} has no solution/solve.sh")
    commands = split_commands(read_task_text(task.task_dir, "solution/solve.sh"))
    if not commands:
        raise TaskError(f"task {task.name}: solution/solve.sh holds no commands")
    return commands


def solution_plan(task: TaskSpec) -> str:
    """The task's one-sentence plan (`[metadata] plan`, generated tasks have one), or a
    generic one."""
    plan = task.config.metadata.get("plan")
    return plan if isinstance(plan, str) and plan.strip() else DEFAULT_PLAN


def solution_walkthrough(task: TaskSpec) -> list[Step]:
    """The task's multi-turn walkthrough (`[metadata] walkthrough`: a list of `{commands,
    finding, carry}`, carry optional), empty when it has none; TaskError when it is malformed."""
    raw = task.config.metadata.get("walkthrough")
    if raw is None:
        return []
    steps = []
    for item in raw if isinstance(raw, list) else [raw]:
        commands = item.get("commands") if isinstance(item, dict) else None
        finding = item.get("finding") if isinstance(item, dict) else None
        carry = item.get("carry", "") if isinstance(item, dict) else None
        if (not isinstance(commands, list) or not commands
                or not all(isinstance(c, str) and c.strip() for c in commands)
                or not isinstance(finding, str) or not isinstance(carry, str)):
            raise TaskError(f"task {task.name}: [metadata] walkthrough must be a list of "
                            "{commands = [non-empty strings], finding = string, carry = string}")
        steps.append(Step(tuple(commands), finding, carry))
    return steps
