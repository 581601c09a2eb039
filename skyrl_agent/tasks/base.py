"""What task sources build on: the TaskSource interface and where the bundled sets live.

It sits below the dispatcher (tasks/sources.py), so a source (swe/source.py, generated.py)
imports it without importing the dispatcher that imports the sources.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

import skyrl_agent
from skyrl_agent.tasks.spec import TaskSpec


class TaskSource(ABC):
    """Turns a reference string into task specs."""

    @abstractmethod
    def load(self, ref: str) -> list[TaskSpec]:
        """The tasks `ref` names, in a stable order; raise TaskError when there are none."""


def bundled_root() -> Path:
    """The bundled task sets: inside an installed wheel, or the checkout's top-level tasks/."""
    package_dir = Path(skyrl_agent.__file__).parent
    installed = package_dir / "bundled_tasks"
    return installed if installed.is_dir() else package_dir.parent / "tasks"


def bundled_sets() -> list[str]:
    root = bundled_root()
    return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
