"""Task loading through harbor's models, task sources, and the bundled demo set's shape."""

from __future__ import annotations

import pytest

from skyrl_agent.errors import TaskError
from skyrl_agent.tasks import bundled_sets, find_task, load_task, resolve_tasks
from tests.conftest import DEMO
from tests.helpers import make_task


def test_demo_set_is_complete():
    tasks = resolve_tasks("demo")
    assert "demo" in bundled_sets()
    assert len(tasks) >= 12
    json_rewards = 0
    for task in tasks:
        assert task.instruction.strip()
        assert (task.solution_dir / "solve.sh").is_file()
        assert (task.tests_dir / "test.sh").is_file()
        dockerfile = task.dockerfile.read_text()
        assert dockerfile.startswith("FROM ubuntu:24.04")
        assert "WORKDIR /app" in dockerfile
        assert not task.network_allowed
        json_rewards += "reward.json" in (task.tests_dir / "test.sh").read_text()
    assert json_rewards >= 3


def test_sources_path_dir_and_filters():
    one = resolve_tasks(str(DEMO / "hello-file"))
    assert [t.name for t in one] == ["demo/hello-file"]
    assert len(resolve_tasks(str(DEMO))) == len(resolve_tasks("demo"))
    picked = resolve_tasks("demo", include=["python"], limit=1)
    assert len(picked) == 1 and "python" in picked[0].name
    with pytest.raises(TaskError, match="matches"):
        resolve_tasks("demo", include=["zzz"])


def test_find_task_by_name_and_dir():
    assert find_task("demo/hello-file").name == "demo/hello-file"
    assert find_task(str(DEMO / "word-count")).name == "demo/word-count"
    with pytest.raises(TaskError, match="no task named"):
        find_task("demo/none")


def test_network_only_when_asked(tmp_path):
    task_dir = make_task(tmp_path, "net", "true\n")
    toml = (task_dir / "task.toml").read_text()
    assert not load_task(task_dir).network_allowed
    (task_dir / "task.toml").write_text(toml.replace('"no-network"', '"public"'))
    assert load_task(task_dir).network_allowed
    # harbor's default (no network_mode line) is public; ours is none.
    (task_dir / "task.toml").write_text(toml.replace('network_mode = "no-network"\n', ""))
    assert not load_task(task_dir).network_allowed


@pytest.mark.parametrize("breakage, message", [
    (lambda d: (d / "task.toml").write_text("[agent\n"), "malformed task.toml"),
    (lambda d: (d / "task.toml").unlink(), "no task.toml"),
    (lambda d: (d / "instruction.md").unlink(), "instruction.md"),
    (lambda d: (d / "tests" / "test.sh").unlink(), "tests/test.sh"),
    (lambda d: (d / "environment" / "Dockerfile").unlink(), "Dockerfile"),
])
def test_broken_tasks_raise_task_error(tmp_path, breakage, message):
    task_dir = make_task(tmp_path, "broken", "true\n")
    breakage(task_dir)
    with pytest.raises(TaskError) as info:
        load_task(task_dir)
    assert message in str(info.value)
