"""FileEditor (`str_replace_editor`) in a real local sandbox: each command, and what it refuses."""

from __future__ import annotations

import pytest

from skyrl_agent.agents.codeact.editor import FileEditor
from skyrl_agent.config import SandboxConfig
from skyrl_agent.envs.env import Env
from skyrl_agent.sandboxes.base import SandboxSpec, create_sandbox
from skyrl_agent.tasks import load_task
from tests.helpers import make_task


@pytest.fixture
async def env(tmp_path):
    task = load_task(make_task(tmp_path, "editor", "true\n"))
    config = SandboxConfig()
    async with create_sandbox(SandboxSpec.from_task(task, config), config) as sandbox:
        yield Env(task, sandbox)


async def test_create_view_and_a_unique_str_replace(env):
    editor = FileEditor(env)
    out = await editor({"command": "create", "path": "main.py", "file_text": "a = 1\nb = 2\n"})
    assert out == "Created /app/main.py (2 lines)."
    out = await editor({"command": "str_replace", "path": "/app/main.py", "old_str": "b = 2",
                        "new_str": "b = 3"})
    assert out.startswith("Edited /app/main.py.") and "     2\tb = 3" in out
    assert await env.read_file("main.py") == "a = 1\nb = 3\n"
    out = await editor({"command": "view", "path": "main.py", "view_range": [2, 2]})
    assert out == "Lines 2-2 of /app/main.py:\n     2\tb = 3"


async def test_an_ambiguous_str_replace_is_refused(env):
    """Stops: applying a str_replace whose old_str occurs more than once (which occurrence the
    model meant is unknown). The file stays as it was."""
    editor = FileEditor(env)
    await env.write_file("/app/dup.py", "x = 1\ny = 2\nx = 1\n")
    out = await editor({"command": "str_replace", "path": "dup.py", "old_str": "x = 1",
                        "new_str": "x = 9"})
    assert out.startswith("ERROR:") and "occurs 2 times (lines [1, 3])" in out
    assert await env.read_file("dup.py") == "x = 1\ny = 2\nx = 1\n"
    out = await editor({"command": "str_replace", "path": "dup.py", "old_str": "z = 0",
                        "new_str": "z = 1"})
    assert out.startswith("ERROR:") and "does not occur" in out


@pytest.mark.parametrize("line, expected", [
    (0, "NEW\na\nb\nc"),
    (1, "a\nNEW\nb\nc"),
    (2, "a\nb\nNEW\nc"),
    (3, "a\nb\nc\nNEW"),
])
async def test_insert_goes_after_the_given_line(env, line, expected):
    """Stops: `insert` being off by one. insert_line N puts the text after line N (0 = at the
    top), as the tool's description tells the model."""
    editor = FileEditor(env)
    await env.write_file("/app/f.txt", "a\nb\nc")
    out = await editor({"command": "insert", "path": "f.txt", "insert_line": line,
                        "new_str": "NEW"})
    assert out.startswith("Edited /app/f.txt."), out
    assert await env.read_file("f.txt") == expected
    out = await editor({"command": "insert", "path": "f.txt", "insert_line": 9, "new_str": "x"})
    assert out.startswith("ERROR:") and "from 0 to 4" in out


async def test_undo_restores_the_latest_edit_first(env):
    """Stops: `undo_edit` restoring the oldest saved version instead of the latest: undoing
    steps back one edit at a time, newest first."""
    editor = FileEditor(env)
    await env.write_file("/app/u.txt", "v1\n")
    for old, new in [("v1", "v2"), ("v2", "v3")]:
        out = await editor({"command": "str_replace", "path": "u.txt", "old_str": old,
                            "new_str": new})
        assert out.startswith("Edited"), out
    assert await env.read_file("u.txt") == "v3\n"
    assert await editor({"command": "undo_edit", "path": "u.txt"}) == \
        "Reverted the last edit of /app/u.txt."
    assert await env.read_file("u.txt") == "v2\n"
    await editor({"command": "undo_edit", "path": "u.txt"})
    assert await env.read_file("u.txt") == "v1\n"
    out = await editor({"command": "undo_edit", "path": "u.txt"})
    assert out == "ERROR: no edit of /app/u.txt to undo"


async def test_create_never_overwrites_an_existing_file(env):
    """Stops: `create` replacing a file that exists (the model must edit it instead)."""
    editor = FileEditor(env)
    await env.write_file("/app/keep.py", "precious = True\n")
    out = await editor({"command": "create", "path": "keep.py", "file_text": "oops\n"})
    assert out.startswith("ERROR:") and "already exists" in out
    assert await env.read_file("keep.py") == "precious = True\n"
    out = await editor({"command": "undo_edit", "path": "keep.py"})
    assert out.startswith("ERROR:")  # a refused create leaves nothing to undo
