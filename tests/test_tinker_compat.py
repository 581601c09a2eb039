"""The Tinker compatibility page is what the installed SDK and the table make, and every test
it names exists and calls the method it vouches for."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "tinker_compat.py"
sys.path.insert(0, str(SCRIPT.parent))
pytest.importorskip("tinker")
from tinker_compat import TABLE, unplaced  # noqa: E402


def test_the_page_is_current_and_places_every_sdk_method():
    """Stops: an SDK release adding a method nobody placed, a row for a method that is gone,
    and a page edited by hand or left stale."""
    assert unplaced() == ([], [])
    result = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_every_named_test_exists_and_calls_its_method():
    """Stops: a row vouched for by a test that was renamed or never calls the method."""
    functions: dict[str, dict[str, str]] = {}
    for method, row in TABLE.items():
        if row.test is None:
            assert row.status == "client-side", method
            continue
        path, name = row.test.split("::")
        if path not in functions:
            functions[path] = _functions(ROOT / path)
        assert name in functions[path], row.test
        helpers = "".join(text for helper, text in functions[path].items()
                          if not helper.startswith("test_"))
        called = method.split(".")[1]
        assert f".{called}(" in functions[path][name] + helpers, (method, row.test)


def _functions(path: Path) -> dict[str, str]:
    """Each top-level function's source, its decorators (a parametrization) included."""
    source = path.read_text()
    out = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef):
            parts = [ast.get_source_segment(source, d) or "" for d in node.decorator_list]
            out[node.name] = "".join(parts) + (ast.get_source_segment(source, node) or "")
    return out
