"""Imports point down only: cli -> jobs -> evaluation, tinker, distributed -> trainers ->
collector -> agents -> envs -> the leaves (sandboxes, inference, tasks, data) -> the core
(types, config, errors, atomic, plugins, stopping, descriptors, images)."""

from __future__ import annotations

import ast
from pathlib import Path

import skyrl_agent

PACKAGE = Path(skyrl_agent.__file__).parent
LAYER = {"types": 0, "config": 0, "errors": 0, "atomic": 0, "plugins": 0, "stopping": 0,
         "descriptors": 0, "images": 0, "__init__": 0,
         "capture": 4, "data": 1, "tasks": 1, "inference": 2, "sandboxes": 2, "envs": 3,
         "agents": 4, "collector": 5, "trainers": 6, "evaluation": 7, "distributed": 7, "harbor": 7,
         "tinker": 7, "jobs": 8, "cli": 9}
"""Rank of each top-level module or package: a module may import its own rank or lower."""


def _imported(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):  # imports inside functions count too
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {n.split(".")[1] for n in names if n.startswith("skyrl_agent.")}


def test_no_module_imports_a_higher_layer():
    upward = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "__main__.py":
            continue  # `python -m` entry points sit on top of everything, like the CLI
        top = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        for target in _imported(ast.parse(path.read_text())):
            if LAYER[target] > LAYER[top]:
                upward.append(f"{path.relative_to(PACKAGE)} imports skyrl_agent.{target}")
    assert upward == []


def test_every_top_level_module_has_a_layer():
    tops = {p.name.removesuffix(".py") for p in PACKAGE.iterdir()
            if (p.suffix == ".py" or (p / "__init__.py").exists()) and p.name != "bundled_tasks"}
    assert tops <= set(LAYER), tops - set(LAYER)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph(prefix: str) -> dict[str, set[str]]:
    """Module -> the modules under `prefix` it imports (`from pkg import mod` names mod)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        if not name.startswith(prefix):
            continue
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                submodules = {f"{node.module}.{alias.name}" for alias in node.names} & set(modules)
                targets |= submodules or {node.module}
            elif isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
        graph[name] = {t for t in targets if t.startswith(prefix) and t != name}
    return graph


def _in_a_cycle(graph: dict[str, set[str]]) -> list[str]:
    def reaches(start: str) -> set[str]:
        seen: set[str] = set()
        todo = list(graph.get(start, ()))
        while todo:
            node = todo.pop()
            if node not in seen:
                seen.add(node)
                todo.extend(graph.get(node, ()))
        return seen
    return sorted(name for name in graph if name in reaches(name))


def test_task_sources_import_no_cycle():
    """The dispatcher (tasks/sources.py) imports the sources; a source imports only what sits
    below the dispatcher (tasks/base.py), never the dispatcher itself."""
    assert _in_a_cycle(_import_graph("skyrl_agent.tasks")) == []


def test_trainers_see_the_collector_only_through_their_protocols():
    """The loops get their groups from a GroupSource (trainers/workers.py); the collector and
    model access are wired to them in jobs/ and distributed/."""
    trainers = [p for p in (PACKAGE / "trainers").rglob("*.py")
                if "collector" in _imported(ast.parse(p.read_text()))]
    assert trainers == []


def test_no_module_imports_itself_through_others():
    """No import circle anywhere in the package, inside a function or not (the last one, between
    capture/messages.py and capture/tools.py, was opened with the jobs/ floor)."""
    assert _in_a_cycle(_import_graph("skyrl_agent")) == []
