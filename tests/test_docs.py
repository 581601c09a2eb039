"""The docs stay true to the code: reference pages generated from it (stale ones fail), every
config field and CLI command in them, a short README whose links resolve."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from skyrl_agent.cli import app
from skyrl_agent.config import RunConfig

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "docs_reference.py"
sys.path.insert(0, str(SCRIPT.parent))
from docs_reference import _commands, config_fields  # noqa: E402


def reference(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=120, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})


def test_the_reference_pages_are_what_the_code_generates(tmp_path):
    """Stops: a config field, CLI option or plug-in added (or its docstring changed) without
    the reference pages regenerated; and a check that cannot see a stale page."""
    result = reference("--check")
    assert result.returncode == 0, result.stderr
    assert reference("--docs", str(tmp_path)).returncode == 0
    page = tmp_path / "configuration.md"
    page.write_text(page.read_text().replace("| `agent.max_turns` |", "| `agent.turns` |"))
    stale = reference("--check", "--docs", str(tmp_path))
    assert stale.returncode == 1 and "configuration.md out of date" in stale.stderr


def test_every_config_field_and_command_is_in_the_reference():
    """Stops: a generator that skips a section, a nested model or a sub-command."""
    configuration = (ROOT / "docs" / "reference" / "configuration.md").read_text()
    keys = [key for key, *_ in config_fields(RunConfig)]
    assert {"agent.context_management", "sandbox.docker.runtime", "trainer.lora_rank",
            "seed"} <= set(keys)
    assert [k for k in keys if f"| `{k}` |" not in configuration] == []
    cli = (ROOT / "docs" / "reference" / "cli.md").read_text()
    paths = [path for path, _ in _commands(typer.main.get_command(app), "skyrl-agent")]
    assert {"skyrl-agent train", "skyrl-agent tasks check", "skyrl-agent eval"} <= set(paths)
    assert [p for p in paths if f"## `{p}`" not in cli] == []
    assert "| `--dry-run`, `--no-dry-run` |" in cli


def test_the_readme_is_short_starts_with_the_two_commands_and_its_links_resolve():
    """Stops: the README growing back into the manual, its first lines not the two commands,
    and a link to a docs page that moved."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150
    assert lines[2:6] == ["```bash",
                          "bash scripts/setup.sh && .venv/bin/skyrl-agent train --steps 3",
                          "bash scripts/test.sh", "```"]
    links = re.findall(r"\]\(([^)]+)\)", "\n".join(lines))
    assert len(links) >= 10
    assert [link for link in links if not (ROOT / link).is_file()] == []


FILE_BLOCK = re.compile(r'```\w+ title="([^"]+)"\n(.*?)```', re.S)
"""A file an example writes: a fenced block titled with its path."""
CONSOLE = re.compile(r"```console\n(.*?)```", re.S)
"""A shell session: `$ COMMAND` lines, each followed by lines its output must hold, in order."""
EXAMPLE_PAGES = sorted(p for p in (ROOT / "docs").rglob("*.md") if CONSOLE.search(p.read_text()))


def sessions(text: str) -> list[tuple[str, list[str]]]:
    """Every `$ COMMAND` of the page's console blocks with the output lines it claims."""
    steps: list[tuple[str, list[str]]] = []
    for block in CONSOLE.findall(text):
        for line in block.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], []))
            elif line.strip() and steps:
                steps[-1][1].append(line.strip())
    return steps


@pytest.mark.slow
@pytest.mark.parametrize("page", EXAMPLE_PAGES, ids=[p.stem for p in EXAMPLE_PAGES])
def test_the_docs_examples_run_and_print_what_they_claim(page, tmp_path):
    """Stops: a docs example that no longer runs, or whose output drifted from what the page
    shows (files written from the page's titled blocks, then each command run in order)."""
    text = page.read_text()
    for path, content in FILE_BLOCK.findall(text):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(content)
    steps = sessions(text)
    assert steps
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "COLUMNS": "200"}
    for command, claimed in steps:
        result = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, (command, result.stderr[-2000:])
        position = 0
        for line in claimed:
            found = result.stdout.find(line, position)
            assert found >= 0, (command, line, result.stdout[-2000:])
            position = found + len(line)
