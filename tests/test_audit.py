"""`tasks audit`: the built-in adversaries game none of the demo tasks, and they do game tasks
built weak on purpose (a grader that imports the agent's module in-process; a grader script
that lives in the agent's workspace)."""

from __future__ import annotations

import json

import pytest

from skyrl_agent.agents.adversaries import ATTACKS
from tests.helpers import make_task
from tests.test_cli import assert_one_line_error, run

pytestmark = pytest.mark.slow

COPY_APP = "FROM ubuntu:24.04\nWORKDIR /app\nCOPY app/ /app/\n"
IN_PROCESS = """mkdir -p /logs/verifier
python3 - <<'PY'
import json, sys
sys.path.insert(0, "/app")
reward = 0.0
try:
    import lib
    reward = float(lib.double(21) == 42)
except Exception:
    pass
json.dump({"reward": reward}, open("/logs/verifier/reward.json", "w"))
PY
"""
GRADER_IN_WORKSPACE = "mkdir -p /logs/verifier\nbash /app/check.sh\n"
CHECK_SH = """#!/bin/bash
if [ "$(cat /app/answer.txt 2>/dev/null)" = 42 ]; then echo 1; else echo 0; fi \
  > /logs/verifier/reward.txt
"""
SOUND = """mkdir -p /logs/verifier
if [ "$(cat /app/answer.txt 2>/dev/null)" = 42 ]; then echo 1; else echo 0; fi \
  > /logs/verifier/reward.txt
"""


def _audit(*args: str) -> tuple[int, dict[str, dict]]:
    result = run("tasks", "audit", *args, "--json")
    assert "Traceback" not in result.stderr, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    return result.returncode, {row["task"]: row for row in rows}


def test_no_demo_task_can_be_gamed():
    status, rows = _audit("demo", "-j", "4")
    assert len(rows) >= 13
    for row in rows.values():
        assert set(row["attacks"]) == set(ATTACKS)  # every attack ran on every task
        assert row["gameable_by"] == [], row
    assert status == 0


@pytest.mark.docker
def test_no_swe_mini_task_can_be_gamed():
    """Two of the six (one per bug kind of two repos) in CI; the whole set is run by hand."""
    status, rows = _audit("swe-mini", "--sandbox", "docker", "-j", "3",
                          "--set", "tasks.include=[textkit-1,durations-2]")
    assert len(rows) == 2
    assert all(row["gameable_by"] == [] and set(row["attacks"]) == set(ATTACKS)
               for row in rows.values()), rows
    assert status == 0


def test_weak_tasks_are_reported(tmp_path):
    make_task(tmp_path, "in-process", IN_PROCESS, solve_sh="true\n", dockerfile=COPY_APP,
              files={"app/lib.py": "def double(x):\n    return x + 2\n"})  # buggy
    make_task(tmp_path, "grader-in-workspace", GRADER_IN_WORKSPACE, dockerfile=COPY_APP,
              files={"app/check.sh": CHECK_SH, "app/answer.txt": "0\n"})
    make_task(tmp_path, "sound", SOUND, dockerfile=COPY_APP, files={"app/answer.txt": "0\n"})
    status, rows = _audit(str(tmp_path), "-j", "4")
    assert status == 1
    assert rows["test/in-process"]["baseline"] == 0.0
    assert "import-time-forger" in rows["test/in-process"]["gameable_by"]
    assert "rewritten-scripts" in rows["test/grader-in-workspace"]["gameable_by"]
    assert rows["test/sound"]["gameable_by"] == []


def test_an_unknown_attack_is_one_line():
    assert_one_line_error(run("tasks", "audit", "demo", "--attack", "nope"), "unknown attack")


GIT_IN_PLACE = """mkdir -p /logs/verifier
r=0
[ "$(git -c safe.directory='*' -C /app log -1 --format=%s 2>/dev/null)" = done ] && r=1
echo "$r" > /logs/verifier/reward.txt
"""


def test_git_read_in_place_is_reported(tmp_path):
    """The repository-indirection adversary is real: a grader running git on the agent's own
    repository (its config, commondir, alternates) runs the forger and is reported."""
    make_task(tmp_path, "git-in-place", GIT_IN_PLACE, dockerfile=COPY_APP,
              files={"app/notes.txt": "todo\n"})
    status, rows = _audit(str(tmp_path), "--attack", "repository-indirection")
    assert status == 1
    assert rows["test/git-in-place"]["gameable_by"] == ["repository-indirection"]
