"""Entry-point discovery: agents, sandboxes, task sources and trainers are all found the same way.

Built-ins register themselves in pyproject.toml under the same groups a third-party package uses,
so there is one lookup path and no special case for our own implementations.
"""

from __future__ import annotations

import functools
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from skyrl_agent.errors import PluginNotFound

AGENTS = "skyrl_agent.agents"
SANDBOXES = "skyrl_agent.sandboxes"
TASK_SOURCES = "skyrl_agent.task_sources"
TRAINERS = "skyrl_agent.trainers"

_KIND = {AGENTS: "agent", SANDBOXES: "sandbox", TASK_SOURCES: "task source", TRAINERS: "trainer"}


_registered: dict[str, dict[str, Any]] = {}


def register(group: str, name: str, obj: Any) -> None:
    """Register an object in-process (notebooks, benchmarks); packages use entry points."""
    _registered.setdefault(group, {})[name] = obj


@functools.cache
def _entries(group: str) -> dict[str, EntryPoint]:
    # Scanning installed distributions takes tens of ms: once per process (see refresh()).
    return {ep.name: ep for ep in entry_points(group=group)}


def refresh() -> None:
    """Forget cached entry points (after installing a plug-in into the running interpreter)."""
    _entries.cache_clear()


def available(group: str) -> list[str]:
    """Names registered in an entry-point group, sorted."""
    return sorted(_entries(group).keys() | _registered.get(group, {}).keys())


def load(group: str, name: str) -> Any:
    """The object registered as `name` in `group`; an unknown name lists the known ones."""
    if name in _registered.get(group, {}):
        return _registered[group][name]
    entry = _entries(group).get(name)
    if entry is None:
        known = ", ".join(available(group)) or "none"
        raise PluginNotFound(f"unknown {_KIND.get(group, group)} {name!r} (available: {known})")
    return entry.load()
