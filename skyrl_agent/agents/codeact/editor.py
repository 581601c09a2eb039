"""The file editor tool (`str_replace_editor`): view, create, str_replace, insert, undo_edit.

Works only through the Env's file and exec calls, so it edits inside the sandbox. Problems come
back as an `ERROR:` observation for the model, never as an exception.
"""

from __future__ import annotations

import posixpath
import shlex
from typing import Any

from skyrl_agent.envs.env import Env

SNIPPET_LINES = 4


class EditorError(ValueError):
    """A command the editor refuses; its message is shown to the model."""


def _numbered(lines: list[str], first: int) -> str:
    return "\n".join(f"{first + i:6}\t{line}" for i, line in enumerate(lines))


class FileEditor:
    """One agent's editor, with per-file undo history."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.history: dict[str, list[str]] = {}

    async def __call__(self, arguments: dict[str, Any]) -> str:
        try:
            return await self._dispatch(arguments)
        except EditorError as exc:
            return f"ERROR: {exc}"

    async def _dispatch(self, args: dict[str, Any]) -> str:
        command, path = args.get("command"), args.get("path")
        if not isinstance(path, str) or not path:
            raise EditorError("`path` is required")
        path = posixpath.normpath(posixpath.join(self.env.workdir, path))
        handlers = {"view": self._view, "create": self._create, "str_replace": self._replace,
                    "insert": self._insert, "undo_edit": self._undo}
        if command not in handlers:
            raise EditorError(f"unknown command {command!r}; use one of {', '.join(handlers)}")
        return await handlers[command](path, args)

    async def _read(self, path: str) -> str:
        try:
            return await self.env.read_file(path)
        except FileNotFoundError:
            raise EditorError(f"no file at {path}") from None

    async def _write(self, path: str, content: str, previous: str | None) -> None:
        await self.env.write_file(path, content)
        if previous is not None:
            self.history.setdefault(path, []).append(previous)

    async def _view(self, path: str, args: dict[str, Any]) -> str:
        is_dir = await self.env.exec(f"test -d {shlex.quote(path)}", timeout=10)
        if is_dir.exit_code == 0:
            listing = await self.env.exec(
                f"find {shlex.quote(path)} -maxdepth 2 -not -path '*/.*' | sort", timeout=30)
            return f"Files and folders in {path}, two levels deep:\n{listing.stdout.rstrip()}"
        lines = (await self._read(path)).split("\n")
        first, last = 1, len(lines)
        view_range = args.get("view_range")
        if view_range is not None:
            if (not isinstance(view_range, list) or len(view_range) != 2
                    or not all(isinstance(v, int) for v in view_range)):
                raise EditorError("view_range must be [first, last] line numbers")
            first, last = view_range[0], len(lines) if view_range[1] == -1 else view_range[1]
            if not 1 <= first <= last <= len(lines):
                raise EditorError(f"view_range {view_range} is outside the file's "
                                  f"{len(lines)} lines")
        return f"Lines {first}-{last} of {path}:\n{_numbered(lines[first - 1 : last], first)}"

    async def _create(self, path: str, args: dict[str, Any]) -> str:
        text = args.get("file_text")
        if not isinstance(text, str):
            raise EditorError("`file_text` is required for create")
        exists = await self.env.exec(f"test -e {shlex.quote(path)}", timeout=10)
        if exists.exit_code == 0:
            raise EditorError(f"{path} already exists; edit it with str_replace or insert")
        await self._write(path, text, None)
        return f"Created {path} ({len(text.splitlines())} lines)."

    async def _replace(self, path: str, args: dict[str, Any]) -> str:
        old, new = args.get("old_str"), args.get("new_str", "")
        if not isinstance(old, str) or not old:
            raise EditorError("`old_str` is required for str_replace")
        if not isinstance(new, str):
            raise EditorError("`new_str` must be a string")
        content = await self._read(path)
        count = content.count(old)
        if count == 0:
            raise EditorError(f"old_str does not occur verbatim in {path}")
        if count > 1:
            starts = [content[:i].count("\n") + 1 for i in _find_all(content, old)]
            raise EditorError(f"old_str occurs {count} times (lines {starts}); make it unique")
        updated = content.replace(old, new, 1)
        await self._write(path, updated, content)
        line = content[: content.index(old)].count("\n")
        return self._snippet(path, updated, line, new.count("\n"))

    async def _insert(self, path: str, args: dict[str, Any]) -> str:
        at, new = args.get("insert_line"), args.get("new_str")
        if not isinstance(new, str):
            raise EditorError("`new_str` is required for insert")
        content = await self._read(path)
        lines = content.split("\n")
        if not isinstance(at, int) or not 0 <= at <= len(lines):
            raise EditorError(f"insert_line must be a line number from 0 to {len(lines)}")
        updated = "\n".join(lines[:at] + new.split("\n") + lines[at:])
        await self._write(path, updated, content)
        return self._snippet(path, updated, at, new.count("\n"))

    async def _undo(self, path: str, args: dict[str, Any]) -> str:
        if not self.history.get(path):
            raise EditorError(f"no edit of {path} to undo")
        await self.env.write_file(path, self.history[path].pop())
        return f"Reverted the last edit of {path}."

    def _snippet(self, path: str, content: str, line: int, added: int) -> str:
        lines = content.split("\n")
        first = max(0, line - SNIPPET_LINES)
        last = min(len(lines), line + added + SNIPPET_LINES + 1)
        return (f"Edited {path}. Lines {first + 1}-{last} now read:\n"
                f"{_numbered(lines[first:last], first + 1)}")


def _find_all(text: str, part: str) -> list[int]:
    positions, start = [], text.find(part)
    while start != -1:
        positions.append(start)
        start = text.find(part, start + 1)
    return positions
