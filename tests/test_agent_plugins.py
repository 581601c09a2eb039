"""Plug-in agents: how their constructors are called, and how their failures reach the user."""

from __future__ import annotations

import os
import subprocess

import pytest

from skyrl_agent.agents.oracle import OracleAgent
from skyrl_agent.collector.one_sample import make_agent
from skyrl_agent.config import load_config
from skyrl_agent.errors import UserError
from tests.test_cli import CLI, assert_one_line_error

BROKEN = '''
from skyrl_agent.agents.oracle import OracleAgent


class BrokenAgent(OracleAgent):
    """Its constructor has a bug that raises TypeError."""

    name = "broken"

    def __init__(self, max_turns: int = 50) -> None:
        super().__init__(max_turns)
        len(max_turns)
'''


def _install_plugin(root, module: str, source: str, entry: str) -> dict[str, str]:
    """A plug-in distribution on PYTHONPATH (a module and its .dist-info with entry points):
    the CLI finds it the way it finds an installed package's agents."""
    (root / f"{module}.py").write_text(source)
    info = root / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[skyrl_agent.agents]\n{entry}\n")
    return {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "200"}


def test_a_plugin_whose_constructor_raises_is_one_line_naming_it(tmp_path):
    """A constructor's TypeError was taken for "does not take max_turns": the agent was built
    again without it (a bug hidden, the turn budget silently dropped) and the second failure
    came out as a traceback. Now it is one line naming the plug-in, before any sandbox starts."""
    env = _install_plugin(tmp_path, "broken_agent", BROKEN, "broken = broken_agent:BrokenAgent")
    result = subprocess.run([*CLI, "rollout", "--agent", "broken", "--tasks", "demo",
                             "--set", "tasks.limit=1", "--output", str(tmp_path / "run")],
                            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert_one_line_error(result, "agent 'broken'", "broken_agent.BrokenAgent",
                          "cannot be created", "TypeError")


class _NoTurns(OracleAgent):
    name = "no-turns"

    def __init__(self) -> None:
        super().__init__(max_turns=7)


class _AnyKeywords(OracleAgent):
    name = "any-keywords"

    def __init__(self, **options: int) -> None:
        super().__init__(**options)


class _TypeBug(OracleAgent):
    name = "type-bug"

    def __init__(self, max_turns: int = 50) -> None:
        super().__init__(max_turns)
        raise TypeError("unsupported operand\nsecond line")


def test_max_turns_goes_only_to_constructors_that_take_it():
    """Which constructor takes max_turns is read from its signature, not guessed from a
    TypeError: one without it still works, one with **kwargs gets it."""
    config = load_config(None, ["agent.max_turns=3"])
    assert make_agent(_NoTurns, config).max_turns == 7
    assert make_agent(_AnyKeywords, config).max_turns == 3
    assert make_agent(OracleAgent, config).max_turns == 3


def test_a_constructor_type_error_is_not_retried_without_max_turns():
    """The old retry hid the plug-in's own TypeError behind a second call's error."""
    with pytest.raises(UserError, match=r"^agent 'type-bug' \(.*_TypeBug\) cannot be created: "
                                        r"TypeError: unsupported operand$"):
        make_agent(_TypeBug, load_config())
