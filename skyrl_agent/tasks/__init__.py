"""Harbor-format tasks: loading task directories and resolving task sets by name."""

from skyrl_agent.tasks.sources import TaskSource, bundled_sets, find_task, resolve_tasks
from skyrl_agent.tasks.spec import TaskSpec, load_task

__all__ = ["TaskSource", "TaskSpec", "bundled_sets", "find_task", "load_task", "resolve_tasks"]
