"""Imports point down only. Every folder has a rank of its own, so no two folders can import
each other; the single-file modules of the core share the ground floor:

cli -> jobs -> harbor -> distributed -> tinker -> evaluation -> rl -> collector -> agents ->
capture -> llm -> envs -> backends -> inference -> sandboxes -> model -> tasks -> data -> the core
(types, config, errors, atomic, plugins, stopping, descriptors, images)."""

from __future__ import annotations

import ast
from pathlib import Path

import skyrl_agent

PACKAGE = Path(skyrl_agent.__file__).parent
CORE = ("types", "config", "errors", "atomic", "plugins", "stopping", "descriptors", "images",
        "__init__")
FOLDERS = ("data", "tasks", "model", "sandboxes", "inference", "backends", "envs", "llm",
           "capture", "agents", "collector", "rl", "evaluation", "tinker", "distributed", "harbor",
           "jobs", "cli")
"""The folders from the bottom up."""
LAYER = {**dict.fromkeys(CORE, 0), **{name: rank for rank, name in enumerate(FOLDERS, 1)}}
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


def test_the_loops_see_the_collector_only_through_their_protocols():
    """The loops get their groups from a GroupSource (rl/workers.py); the collector and model
    access are wired to them in jobs/ and distributed/."""
    assert _importers("rl", "collector") == []


def test_no_module_imports_itself_through_others():
    """No import circle anywhere in the package, inside a function or not (the last one, between
    capture/messages.py and capture/tools.py, was opened with the jobs/ floor)."""
    assert _in_a_cycle(_import_graph("skyrl_agent")) == []


def _importers(folder: str, of: str) -> list[str]:
    return sorted(str(p.relative_to(PACKAGE)) for p in (PACKAGE / folder).rglob("*.py")
                  if of in _imported(ast.parse(p.read_text())))


def test_the_tinker_server_uses_backends_never_the_rl_loops():
    """tinker/ serves Tinker's primitives over backends/; what drives them (rl/) is its
    client's business, as in the cookbook."""
    assert _importers("tinker", "backends") != []
    assert _importers("tinker", "rl") == []


def test_backends_and_loops_never_reach_the_inference_servers():
    """A backend produces weights and the loop publishes them through rl.workers.ServerControl;
    neither speaks HTTP to a server (what both must agree on with it is in model/)."""
    assert _importers("backends", "inference") == []
    assert _importers("rl", "inference") == []
    assert _importers("backends", "rl") == []


def test_no_folder_loop():
    """Folders import each other in one direction only, whatever the ranks say."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name == "__main__.py":
            continue  # entry points sit on top of everything
        top = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        graph.setdefault(top, set()).update(
            t for t in _imported(ast.parse(path.read_text())) if t != top)
    assert _in_a_cycle(graph) == []
