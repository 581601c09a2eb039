"""Completion request bodies, with a session's prompt ids encoded a turn at a time.

An agent's prompt is the previous prompt, the reply and a few new messages, so re-encoding
the whole context as JSON every turn costs O(context) per turn: at 2k tokens it was the
client's largest cost per step. A session keeps the JSON text of the ids it sent last; a
prompt that starts with them only encodes what follows. The bytes are the same either way.
"""

from __future__ import annotations

import json
from typing import Any

_COMPACT = (",", ":")


def ids_text(ids: list[int]) -> str:
    """The ids as the inside of a JSON array: `1,2,3`."""
    return json.dumps(ids, separators=_COMPACT)[1:-1]


class PromptIds:
    """One session's last prompt ids and their JSON text."""

    def __init__(self) -> None:
        self._ids: list[int] = []
        self._text = ""

    def text(self, ids: list[int]) -> str:
        """JSON text of `ids` (inside the brackets), reusing the last prompt's when `ids`
        extends it. The list is kept: the caller must not change it afterwards."""
        known = len(self._ids)
        if known and len(ids) >= known and ids[:known] == self._ids:
            tail = ids_text(ids[known:])
            text = f"{self._text},{tail}" if tail else self._text
        else:
            text = ids_text(ids)
        self._ids, self._text = ids, text
        return text


def completion_body(fields: dict[str, Any], prompt_text: str, key: str = "prompt") -> bytes:
    """A request body: `fields` plus `"KEY": [prompt_text]` (`prompt` for `/v1/completions`,
    `token_ids` for vLLM's `/inference/v1/generate`)."""
    head = json.dumps(fields, separators=_COMPACT)[:-1]
    return f'{head}{"," if fields else ""}"{key}":[{prompt_text}]}}'.encode()
