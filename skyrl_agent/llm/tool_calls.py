"""Reading tool calls from model text: native JSON tool calls or the `<function=...>` format.

Accepted, in this order:
- `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes/Qwen-style native calls);
- `<function=NAME><parameter=KEY>VALUE</parameter>...</function>` (OpenHands' text format);
- a bare JSON object `{"name": ..., "arguments": ...}`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_FUNCTION = re.compile(r"<function=([\w.-]+)>(.*?)(?:</function>|$)", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([\w.-]+)>(.*?)</parameter>", re.DOTALL)


class NoToolCall(ValueError):
    """The reply holds no usable tool call; the message says why."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


def _from_json(text: str) -> ToolCall:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise NoToolCall(f"the tool call is not valid JSON ({exc.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        raise NoToolCall("a JSON tool call needs a string \"name\"")
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            raise NoToolCall("the tool call's \"arguments\" string is not JSON") from None
    if not isinstance(arguments, dict):
        raise NoToolCall("the tool call's \"arguments\" must be an object")
    return ToolCall(data["name"], arguments)


def _strip_one_newline(value: str) -> str:
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every tool call in the reply, in order; NoToolCall when there is none."""
    native = _TOOL_CALL.findall(text)
    if native:
        return [_from_json(block) for block in native]
    calls = [ToolCall(name, {k: _strip_one_newline(v) for k, v in _PARAMETER.findall(body)})
             for name, body in _FUNCTION.findall(text)]
    if calls:
        return calls
    stripped = text.strip()
    if stripped.startswith("{") and stripped.endswith("}"):
        return [_from_json(stripped)]
    raise NoToolCall("the reply has no tool call")
