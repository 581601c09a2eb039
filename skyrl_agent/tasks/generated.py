"""The `gen` task source: tasks of generated families, written as Harbor task directories.

    gen:FAMILY:SPLIT[:COUNT]    gen:write-file:train   gen:count@2:heldout:10   gen:all:train:40

FAMILY is a family name, `NAME@DIFFICULTY`, `all` (every family; `all@2`), or a comma list of
these. SPLIT is `train` or `heldout` (the seed ranges of families/base.py). COUNT is how many
seeds per family, from the start of the split (default 20). Tasks come interleaved by seed, so
`tasks.limit` keeps every family. Each task is generated into the project's cache once, under
a name holding the hash of its files, and loaded from there like any Harbor task.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from skyrl_agent.atomic import atomic_folder
from skyrl_agent.config import cache_dir
from skyrl_agent.errors import TaskError
from skyrl_agent.tasks.base import TaskSource
from skyrl_agent.tasks.families import FAMILIES, SPLITS, Family, GeneratedTask, family
from skyrl_agent.tasks.spec import TaskSpec, load_task

DEFAULT_COUNT = 20
"""Seeds per family when a `gen:` reference names no count."""


@dataclass(frozen=True)
class Selection:
    """What a `gen:` reference names."""

    families: tuple[tuple[Family, int], ...]
    """(family, difficulty) pairs, in the reference's order."""
    seeds: range
    """The seeds each pair is generated for."""


def _families(spec: str) -> list[tuple[Family, int]]:
    chosen = []
    for part in spec.split(","):
        name, _, level = part.strip().partition("@")
        try:
            difficulty = int(level) if level else 1
        except ValueError:
            raise TaskError(f"difficulty must be a number in {part!r}") from None
        for fam in FAMILIES.values() if name == "all" else [family(name)]:
            if difficulty not in fam.difficulties:
                raise TaskError(f"family {fam.name} has difficulties 1..{len(fam.levels)}, "
                                f"not {difficulty}")
            chosen.append((fam, difficulty))
    return chosen


def parse_ref(ref: str) -> Selection:
    """`FAMILY:SPLIT[:COUNT]` (what follows `gen:`) -> a Selection; TaskError when malformed."""
    parts = ref.split(":")
    if len(parts) not in (2, 3) or not all(parts):
        raise TaskError(f"gen:{ref}: expected gen:FAMILY:SPLIT[:COUNT], e.g. gen:write-file:train "
                        "or gen:all@2:heldout:10")
    split = SPLITS.get(parts[1])
    if split is None:
        raise TaskError(f"gen:{ref}: split must be one of {', '.join(SPLITS)}, not {parts[1]!r}")
    count = DEFAULT_COUNT
    if len(parts) == 3:
        if not parts[2].isdigit() or not 0 < int(parts[2]) <= len(split):
            raise TaskError(f"gen:{ref}: count must be 1..{len(split)}, not {parts[2]!r}")
        count = int(parts[2])
    return Selection(tuple(_families(parts[0])), range(split.start, split.start + count))


def generate(selection: Selection) -> list[GeneratedTask]:
    """The selection's tasks, interleaved by seed."""
    return [fam.generate(seed, difficulty) for seed in selection.seeds
            for fam, difficulty in selection.families]


def write_task(task: GeneratedTask, directory: Path) -> None:
    """Write the task's files under `directory` (which must not exist)."""
    for path, data in task.files().items():
        target = directory / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def materialize(task: GeneratedTask, root: Path | None = None) -> Path:
    """The task's directory in the cache, written once (atomically: concurrent runs agree)."""
    root = root or cache_dir() / "tasks"
    final = root / task.family.name / f"d{task.difficulty}-{task.seed}-{task.digest()[:16]}"
    if (final / "task.toml").is_file():
        return final
    with atomic_folder(final) as staging:  # first writer wins: concurrent runs agree
        write_task(task, staging)
        os.chmod(staging, 0o755)  # readable by a sandbox's user whatever the umask
    if not (final / "task.toml").is_file():
        raise TaskError(f"could not write the generated task {task.name} into {final}")
    return final


class GeneratedSource(TaskSource):
    """`gen:FAMILY:SPLIT[:COUNT]`: generated tasks (see the module docstring)."""

    def load(self, ref: str) -> list[TaskSpec]:
        return [load_task(materialize(task)) for task in generate(parse_ref(ref))]
