"""The `swe` task source: SWE-bench-format instances as tasks.

    --tasks swe-bench | swe-bench-lite | swe-gym     a hub dataset, from the local HF cache
    --tasks PATH.jsonl | PATH.parquet | PATH.json    a file of instances
    --tasks swe-mini                                 the bundled set (tasks/swe-mini/)
    --tasks swe:ARG                                  any of these, explicitly

A repo whose git fast-import stream sits in a `repos/` folder beside the instance file (or in a
bundled SWE set's, as the swe-mini repos do) is built on the local base image; any other
instance runs on its SWE-bench instance image, which the Docker engine must have.
"""

from __future__ import annotations

from pathlib import Path

from skyrl_agent.errors import TaskError
from skyrl_agent.tasks.base import TaskSource, bundled_root, bundled_sets
from skyrl_agent.tasks.spec import TaskSpec
from skyrl_agent.tasks.swe.harness import require_swebench
from skyrl_agent.tasks.swe.instance import (
    DATASETS,
    FILE_SUFFIXES,
    SweInstance,
    load_dataset_instances,
    read_instances,
)
from skyrl_agent.tasks.swe.materialize import Origin, materialize

INSTANCES_FILE = "instances.jsonl"
"""A bundled task set in SWE-bench format holds this file (and a `repos/` folder)."""


def bundled_repo_dirs() -> tuple[Path, ...]:
    """The `repos/` folders of the bundled SWE-format sets."""
    root = bundled_root()
    return tuple(root / name / "repos" for name in bundled_sets()
                 if (root / name / INSTANCES_FILE).is_file())


def stream_name(repo: str) -> str:
    """The file name of a repo's fast-import stream: `owner/name` -> `owner__name.fi`."""
    return repo.replace("/", "__") + ".fi"


def is_instance_file(ref: str) -> bool:
    path = Path(ref)
    return path.suffix in FILE_SUFFIXES and path.is_file()


class SweSource(TaskSource):
    """SWE-bench-format instances from a file or a named dataset, as task specs."""

    def __init__(self, label: str | None = None) -> None:
        self.repo_dirs = bundled_repo_dirs()
        """Folders searched for repo streams after the instance file's own `repos/`."""
        self.label = label
        """The prefix of task names (default: the dataset name or the file's stem)."""

    def load(self, ref: str) -> list[TaskSpec]:
        require_swebench()
        if ref in DATASETS:
            instances = load_dataset_instances(ref)
            return self._tasks(instances, self.label or ref, (),
                               DATASETS[ref].image_namespace)
        if not is_instance_file(ref):
            names = ", ".join(DATASETS)
            raise TaskError(f"swe: {ref!r} is neither a file of instances "
                            f"({', '.join(FILE_SUFFIXES)}) nor a dataset ({names})")
        path = Path(ref)
        dirs = (path.parent / "repos", *self.repo_dirs)
        return self._tasks(read_instances(path), self.label or path.stem, dirs, "swebench")

    def _tasks(self, instances: list[SweInstance], label: str, repo_dirs: tuple[Path, ...],
               namespace: str) -> list[TaskSpec]:
        tasks = []
        for instance in instances:
            streams = (d / stream_name(instance.repo) for d in repo_dirs)
            stream = next((s for s in streams if s.is_file()), None)
            tasks.append(materialize(instance, f"{label}/{instance.instance_id}",
                                     Origin(stream, namespace)))
        return tasks
