"""The demo set is sound on both backends: oracle scores 1.0 and nop 0.0 on every task."""

from __future__ import annotations

import json

import pytest

from tests.test_cli import run

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("agent, expected", [("oracle", 1.0), ("nop", 0.0)])
def test_demo_check(backend, agent, expected):
    result = run("tasks", "check", "demo", "--sandbox", backend, "--agent", agent, "-j", "2",
                 "--json")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(rows) >= 12
    assert {r["task"] for r in rows} == {f"demo/{p}" for p in _demo_dirs()}
    for row in rows:
        assert row["reason"] is None, row
        assert row["reward"] == expected, row


def test_table_output_and_expect_flag():
    ok = run("tasks", "check", "demo", "--agent", "oracle", "--expect", "1.0", "-j", "2")
    assert ok.returncode == 0
    assert "mean reward 1.000" in ok.stdout
    failing = run("tasks", "check", "demo", "--agent", "nop", "--expect", "1.0",
                  "--set", "tasks.include=[hello]")
    assert failing.returncode == 1
    assert "mean reward 0.000" in failing.stdout


def _demo_dirs():
    from tests.conftest import DEMO
    return sorted(p.name for p in DEMO.iterdir() if (p / "task.toml").is_file())
