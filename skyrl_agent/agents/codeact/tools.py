"""Tool schemas matching OpenHands' CodeAct names and parameters (descriptions written here)."""

from __future__ import annotations

from typing import Any


def _function(name: str, description: str, properties: dict[str, Any],
              required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required}}}


EXECUTE_BASH = _function(
    "execute_bash",
    "Run a bash command in the task's sandbox and see its output and exit code. The working "
    "directory carries over between calls; environment variables do not. Long-running commands "
    "are stopped at the timeout.",
    {"command": {"type": "string", "description": "The bash command (may span lines)."},
     "timeout": {"type": "number", "description": "Seconds before the command is stopped."}},
    ["command"])

STR_REPLACE_EDITOR = _function(
    "str_replace_editor",
    "View, create and edit files. `view` shows a file with line numbers or lists a folder; "
    "`create` writes a new file; `str_replace` replaces one exact, unique occurrence of old_str; "
    "`insert` adds new_str after line insert_line; `undo_edit` reverts the last edit of a file.",
    {"command": {"type": "string",
                 "enum": ["view", "create", "str_replace", "insert", "undo_edit"]},
     "path": {"type": "string", "description": "Absolute path, or relative to the workdir."},
     "file_text": {"type": "string", "description": "Content for `create`."},
     "old_str": {"type": "string", "description": "Exact text to replace (`str_replace`)."},
     "new_str": {"type": "string", "description": "Replacement or inserted text."},
     "insert_line": {"type": "integer", "description": "Line after which to insert."},
     "view_range": {"type": "array", "items": {"type": "integer"},
                    "description": "[first, last] lines to view; last -1 means to the end."}},
    ["command", "path"])

THINK = _function(
    "think", "Write down reasoning or a plan. Changes nothing.",
    {"thought": {"type": "string", "description": "The thought."}}, ["thought"])

FINISH = _function(
    "finish", "Declare the task done; your work is then graded.",
    {"message": {"type": "string", "description": "A short summary of what you did."}}, [])

VIEW_IMAGE = _function(
    "view_image", "Look at an image file (PNG or JPEG): it is shown to you with the result.",
    {"path": {"type": "string", "description": "Absolute path, or relative to the workdir."}},
    ["path"])

TOOLS = [EXECUTE_BASH, STR_REPLACE_EDITOR, THINK, FINISH]
VISION_TOOLS = [VIEW_IMAGE]
"""Offered only to a model that sees images."""
