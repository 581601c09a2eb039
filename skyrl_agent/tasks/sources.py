"""Task sources: where task directories come from.

`path` (a task dir or a dir of them), `bundled` (a set under the top-level `tasks/` folder) and
`swe` (SWE-bench-format instances: tasks/swe/) are built in; more sources register under the
entry-point group `skyrl_agent.task_sources` and are addressed as `NAME:ARG`. A file of
instances (.jsonl, .parquet, .json) or a dataset name (swe-bench, swe-gym, ...) needs no prefix.
"""

from __future__ import annotations

from pathlib import Path

from skyrl_agent import plugins
from skyrl_agent.errors import TaskError
from skyrl_agent.tasks.base import TaskSource, bundled_root, bundled_sets
from skyrl_agent.tasks.spec import TaskSpec, load_task


def _task_dirs(root: Path) -> list[Path]:
    """Directories under root holding a task.toml, not descending into a task."""
    if (root / "task.toml").is_file():
        return [root]
    found: list[Path] = []
    for child in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        found.extend(_task_dirs(child))
    return found


class PathSource(TaskSource):
    """A task directory, or a directory that holds task directories."""

    def load(self, ref: str) -> list[TaskSpec]:
        root = Path(ref)
        if not root.is_dir():
            raise TaskError(f"task path not found: {ref}")
        from skyrl_agent.tasks.swe.source import INSTANCES_FILE, SweSource
        if (root / INSTANCES_FILE).is_file():  # a folder of SWE-bench-format instances
            return SweSource(label=root.resolve().name).load(str(root / INSTANCES_FILE))
        dirs = _task_dirs(root)
        if not dirs:
            raise TaskError(f"no Harbor tasks (task.toml) under {ref}")
        return [load_task(d) for d in dirs]


def _swe_set(name: str) -> Path | None:
    """The instance file of a bundled set in SWE-bench format, None for a Harbor set."""
    from skyrl_agent.tasks.swe.source import INSTANCES_FILE
    path = bundled_root() / name / INSTANCES_FILE
    return path if path.is_file() else None


class BundledSource(TaskSource):
    """A task set shipped with skyrl-agent, by name."""

    def load(self, ref: str) -> list[TaskSpec]:
        if ref not in bundled_sets():
            raise TaskError(f"unknown task set {ref!r} (bundled: {', '.join(bundled_sets())})")
        return PathSource().load(str(bundled_root() / ref))


def _is_path(ref: str) -> bool:
    try:
        return Path(ref).exists()
    except OSError:  # e.g. a long `SOURCE:ARG` reference is no file name
        return False


def _source_for(ref: str) -> tuple[TaskSource, str]:
    from skyrl_agent.tasks.swe.instance import DATASETS
    from skyrl_agent.tasks.swe.source import SweSource, is_instance_file
    prefix, sep, rest = ref.partition(":")
    if sep and prefix in plugins.available(plugins.TASK_SOURCES) and not _is_path(ref):
        return plugins.load(plugins.TASK_SOURCES, prefix)(), rest
    if is_instance_file(ref) or ref in DATASETS:
        return SweSource(), ref
    if _is_path(ref):
        return PathSource(), ref
    if ref in bundled_sets():
        return BundledSource(), ref
    sources = ", ".join(plugins.available(plugins.TASK_SOURCES))
    raise TaskError(
        f"unknown task set or path {ref!r} (bundled sets: {', '.join(bundled_sets())}; "
        f"datasets: {', '.join(DATASETS)}; sources: {sources})"
    )


def resolve_tasks(ref: str, include: list[str] | None = None,
                  limit: int | None = None) -> list[TaskSpec]:
    """The tasks a reference names, filtered by substrings of their names and cut to `limit`."""
    source, arg = _source_for(ref)
    tasks = source.load(arg)
    if include:
        tasks = [t for t in tasks if any(s in t.name for s in include)]
        if not tasks:
            raise TaskError(f"no task in {ref!r} matches {include}")
    return tasks[:limit] if limit else tasks


def _generated(name: str) -> TaskSpec | None:
    """A generated task by its name (gen/FAMILY-dD-SEED), or None for any other name."""
    from skyrl_agent.tasks.families.base import TASK_NAME

    match = TASK_NAME.match(name)
    if match is None:
        return None
    from skyrl_agent.tasks.families import family
    from skyrl_agent.tasks.generated import materialize

    try:
        task = family(match["family"]).generate(int(match["seed"]), int(match["difficulty"]))
    except ValueError as exc:
        raise TaskError(f"no task named {name!r}: {exc}") from None
    return load_task(materialize(task))


def find_task(name: str) -> TaskSpec:
    """One task by path, by `[task] name` (e.g. demo/hello-file) or by `SET/DIR` in a bundled
    set."""
    if Path(name).is_dir():
        return load_task(name)
    generated = _generated(name)
    if generated is not None:
        return generated
    for set_name in bundled_sets():
        candidate = bundled_root() / set_name / name.removeprefix(f"{set_name}/")
        if (candidate / "task.toml").is_file():
            return load_task(candidate)
    for set_name in bundled_sets():
        if _swe_set(set_name) is not None and not name.startswith(f"{set_name}/"):
            continue  # materializing a SWE set needs swebench: only for its own task names
        for task in BundledSource().load(set_name):
            if task.name == name:
                return task
    raise TaskError(f"no task named {name!r} (try `skyrl-agent tasks list`)")
