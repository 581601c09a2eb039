"""Generated task families: a generator + a seed -> a Harbor task (see base.py).

Every family's difficulty is a parameter (1 = easiest); `skyrl-agent tasks families` lists them.
"""

from __future__ import annotations

from collections.abc import Iterable

from skyrl_agent.errors import TaskError
from skyrl_agent.tasks.families import archive, git, picture, python_bug, text, trail
from skyrl_agent.tasks.families.base import (
    HELDOUT_SEEDS,
    SPLITS,
    TRAIN_SEEDS,
    Family,
    GeneratedTask,
    split_of,
    task_name,
)

FAMILIES: dict[str, Family] = {f.name: f for module in (text, archive, python_bug, git, trail,
                                                        picture)
                               for f in module.FAMILIES}
"""Every built-in family by name."""


def refuse_heldout(names: Iterable[str], what: str) -> None:
    """Raise when any task name is a held-out generated task: trainers never see those."""
    leaked = sorted({name for name in names if split_of(name) == "heldout"})
    if leaked:
        shown = ", ".join(leaked[:3]) + (f" and {len(leaked) - 3} more" if len(leaked) > 3 else "")
        raise TaskError(f"{what} holds held-out tasks ({shown}): they are for evaluation only; "
                        "train on the train split (gen:NAME:train)")


def family(name: str) -> Family:
    """The family called `name`; an unknown name lists the known ones."""
    if name not in FAMILIES:
        raise TaskError(f"unknown task family {name!r} (families: {', '.join(FAMILIES)})")
    return FAMILIES[name]


__all__ = ["FAMILIES", "HELDOUT_SEEDS", "SPLITS", "TRAIN_SEEDS", "Family", "GeneratedTask",
           "family", "refuse_heldout", "split_of", "task_name"]
