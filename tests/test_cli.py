"""The command line, run as a real subprocess: versions, listings, and one-line errors (exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import make_task

CLI = [str(Path(sys.executable).parent / "skyrl-agent")]


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=300)


def assert_one_line_error(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error:")
    for needle in needles:
        assert needle in lines[0]


def test_version():
    result = run("--version")
    assert result.returncode == 0
    from skyrl_agent import __version__
    assert result.stdout.strip() == f"skyrl-agent {__version__}"


def test_an_error_line_keeps_the_brackets_of_what_the_user_typed():
    """Rich would read `[bold]` in a user's input as markup and drop it from the error line."""
    result = run("rollout", "--tasks", "nosuch[bold]set")
    assert_one_line_error(result, "nosuch[bold]set")


def test_tasks_list_and_show():
    sets = run("tasks", "list")
    assert sets.returncode == 0 and "demo" in sets.stdout
    demo = run("tasks", "list", "demo")
    assert demo.returncode == 0
    assert demo.stdout.count("demo/") >= 12
    show = run("tasks", "show", "demo/hello-file")
    assert show.returncode == 0
    assert "greeting" in show.stdout.lower()


def test_malformed_task_toml(tmp_path):
    task = make_task(tmp_path, "broken", "echo 1 > /logs/verifier/reward.txt\n")
    (task / "task.toml").write_text("[agent\ntimeout_sec = 3\n")
    assert_one_line_error(run("tasks", "check", str(task)), "malformed task.toml", str(task))


def test_invalid_task_toml_value(tmp_path):
    task = make_task(tmp_path, "badvalue", "echo 1 > /logs/verifier/reward.txt\n")
    (task / "task.toml").write_text('[verifier]\ntimeout_sec = "soon"\n')
    assert_one_line_error(run("tasks", "check", str(task)), "invalid task.toml", "timeout_sec")


def test_missing_instruction(tmp_path):
    task = make_task(tmp_path, "noinstr", "echo 1 > /logs/verifier/reward.txt\n")
    (task / "instruction.md").unlink()
    assert_one_line_error(run("tasks", "check", str(task)), "instruction.md")


def test_unknown_sandbox():
    assert_one_line_error(run("tasks", "check", "demo", "--sandbox", "firecracker"),
                          "unknown sandbox 'firecracker'", "local", "docker")


def test_unknown_task_set():
    assert_one_line_error(run("tasks", "check", "no-such-set"), "no-such-set", "demo")


def test_unknown_agent():
    assert_one_line_error(run("tasks", "check", "demo", "--agent", "wizard"),
                          "unknown agent 'wizard'", "oracle", "nop")


@pytest.mark.parametrize("override, needle", [
    ("sandbox.colour=blue", "sandbox.colour: unknown key"),
    ("sandbox.pids_limit=-3", "sandbox.pids_limit"),
    ("collector.n_samples_per_task=0", "collector.n_samples_per_task"),
])
def test_bad_config_override(override, needle):
    assert_one_line_error(run("tasks", "check", "demo", "--set", override), needle)


def test_bad_config_file(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("sandbox:\n  backend: local\n  memory: 12\n")
    assert_one_line_error(run("tasks", "check", "demo", "--config", str(config)),
                          "sandbox.memory: unknown key")
    missing = tmp_path / "nope.toml"
    assert_one_line_error(run("tasks", "check", "demo", "--config", str(missing)),
                          "config file not found")


@pytest.mark.parametrize("command", [["rollout", "--tasks", "2024"],
                                     ["train", "--dry-run", "--tasks", "2024", "--output", "1e3"]])
def test_an_option_that_looks_like_a_number_stays_text(command, tmp_path):
    """A task set named `2024` reached the config re-parsed as YAML, became the number 2024 and
    failed as "not a valid string": the option's typed value must reach the task source."""
    result = run(*command, cwd=tmp_path)
    assert_one_line_error(result, "unknown task set or path '2024'")


@pytest.mark.parametrize("argv, message", [
    (["--engine", "sglang"], "--engine 'sglang': embedded or vllm"),
    (["--engine", "vllm", "--model", "/no/such/folder"], "unknown model '/no/such/folder'"),
])
def test_serve_bad_engine_input_is_one_error_line(argv, message):
    assert_one_line_error(run("serve", *argv), message)
