"""Tool calls through the proxy: OpenAI `tools` in, OpenAI `tool_calls` out.

A chat template that renders tool definitions gets them as they are. One that does not (such as
SmolLM2's) would hide them from the model, so the proxy describes them in the system message and
asks for CodeAct's `<function=NAME><parameter=KEY>VALUE</parameter></function>` format. Replies
are read with the CodeAct parser either way (it also reads Hermes-style `<tool_call>` JSON).
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Sequence
from typing import Any

from skyrl_agent.capture.messages import Call
from skyrl_agent.llm.tool_calls import NoToolCall, parse_tool_calls

_PROBE_TOOL = [{"type": "function", "function": {
    "name": "probe_tool_4f1c", "description": "", "parameters": {"type": "object"}}}]
_CALL_MARKERS = ("<function=", "<tool_call>")


def template_renders_tools(tokenizer: Any) -> bool:
    """True when the chat template shows tool definitions to the model."""
    messages = [{"role": "user", "content": "x"}]
    try:
        plain = tokenizer.apply_chat_template(messages, tokenize=False)
        with_tools = tokenizer.apply_chat_template(messages, tools=_PROBE_TOOL, tokenize=False)
    except Exception:  # noqa: BLE001 - a template that fails on tools does not render them
        return False
    return "probe_tool_4f1c" in with_tools and with_tools != plain


def describe(tools: Sequence[dict[str, Any]]) -> str:
    """System-message text that tells the model its tools and how to call them."""
    lines = ["You can call these tools (functions). Their parameters are JSON schemas:"]
    for tool in tools:
        function = tool.get("function", tool)
        lines.append(f"- {function.get('name')}: {function.get('description', '').strip()}")
        lines.append(f"  parameters: {json.dumps(function.get('parameters', {}))}")
    lines += ["To call a tool, write the call in exactly this format (one parameter per line):",
              "<function=NAME>", "<parameter=KEY>VALUE</parameter>", "</function>"]
    return "\n".join(lines)


def split_reply(text: str, tools: Sequence[dict[str, Any]]) -> tuple[str, tuple[Call, ...]]:
    """A reply's text before its first tool call, and the calls (none when it has none or
    they do not parse: the agent then sees plain text, as from any model)."""
    try:
        parsed = parse_tool_calls(text)
    except NoToolCall:
        return text, ()
    starts = [i for i in (text.find(m) for m in _CALL_MARKERS) if i >= 0]
    content = text[: min(starts)].strip() if starts else ""
    schemas = {t.get("function", t).get("name"): t.get("function", t) for t in tools}
    calls = tuple(Call(f"call_{uuid.uuid4().hex[:24]}", call.name,
                       json.dumps(_typed(call.arguments, schemas.get(call.name))))
                  for call in parsed)
    return content, calls


def _typed(arguments: dict[str, Any], schema: dict[str, Any] | None) -> dict[str, Any]:
    """Text parameters converted to the types their schema declares (numbers, booleans,
    arrays, objects); values that do not convert stay text."""
    properties = ((schema or {}).get("parameters") or {}).get("properties") or {}
    typed = dict(arguments)
    for key, value in arguments.items():
        kind = (properties.get(key) or {}).get("type")
        if isinstance(value, str) and kind in ("integer", "number", "boolean", "array",
                                               "object"):
            with contextlib.suppress(ValueError):
                typed[key] = json.loads(value)
    return typed
