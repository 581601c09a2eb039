"""The OpenAI Responses and Anthropic Messages wire formats, as chat requests and back.

Harbor's relay forwards an agent's model calls untranslated, so the proxy meets the format the
agent speaks. Each request is turned into the chat request it means (a system message from
`instructions` / `system`, tool calls and tool results as chat messages, tools in the function
format) and answered by the same recorder as `/v1/chat/completions`; the reply goes back in the
agent's format. An echoed reply converts to the very chat message that was returned, so a
conversation continues its segment whichever format it arrives in. Whatever a format has that
a recorded chat turn cannot hold (images, server-side state, built-in tools) is refused with a
400 rather than dropped.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from skyrl_agent.capture.messages import BadRequest, ChatRequest
from skyrl_agent.capture.recorder import Captured

JSON = dict[str, Any]


def _object(value: Any, where: str) -> JSON:
    if not isinstance(value, dict):
        raise BadRequest(f"{where} must be an object")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise BadRequest(f"{where} must be a list")
    return value


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise BadRequest(f"{where} must be a string")
    return value


def _texts(content: Any, kinds: tuple[str, ...], where: str) -> str:
    """A string, or the text of a list of text parts of the given kinds."""
    if isinstance(content, str):
        return content
    parts = []
    for i, part in enumerate(_list(content, where)):
        part = _object(part, f"{where}[{i}]")
        if part.get("type") not in kinds:
            raise BadRequest(f"{where}[{i}]: only text parts are supported, not "
                             f"{part.get('type')!r}")
        parts.append(_string(part.get("text"), f"{where}[{i}].text"))
    return "".join(parts)


def _call(call_id: str, name: str, arguments: str) -> JSON:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": arguments}}


def _chat(body: JSON, messages: list[JSON], tools: list[JSON] | None, max_tokens: Any,
          stop: Any) -> ChatRequest:
    chat: JSON = {"model": body.get("model") or "", "messages": messages,
                  "stream": body.get("stream", False), "max_tokens": max_tokens, "stop": stop}
    if tools:
        chat["tools"] = tools
    return ChatRequest.model_validate(chat)


# ---- OpenAI Responses -------------------------------------------------------------------------

def chat_from_responses(body: JSON) -> ChatRequest:
    """POST /v1/responses as the chat request it means (stateless: no previous_response_id)."""
    if body.get("previous_response_id"):
        raise BadRequest("previous_response_id is not supported: send the whole input")
    messages: list[JSON] = []
    if body.get("instructions"):
        messages.append({"role": "system",
                         "content": _string(body["instructions"], "instructions")})
    raw = body.get("input")
    items = [{"role": "user", "content": raw}] if isinstance(raw, str) else _list(raw, "input")
    for i, item in enumerate(items):
        item, where = _object(item, f"input[{i}]"), f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise BadRequest(f"{where} has an unknown role {role!r}")
            text = _texts(item.get("content"), ("input_text", "output_text", "text"), where)
            messages.append({"role": role, "content": text})
        elif kind == "function_call":
            call = _call(_string(item.get("call_id"), f"{where}.call_id"),
                         _string(item.get("name"), f"{where}.name"),
                         _string(item.get("arguments", "{}"), f"{where}.arguments"))
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": ""}
                messages.append(last)
            last.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool",
                             "tool_call_id": _string(item.get("call_id"), f"{where}.call_id"),
                             "content": _texts(output, ("input_text", "output_text"), where)})
        else:
            raise BadRequest(f"{where}: input items of type {kind!r} are not supported")
    tools = []
    for i, tool in enumerate(_list(body.get("tools") or [], "tools")):
        tool = _object(tool, f"tools[{i}]")
        if tool.get("type") != "function":
            raise BadRequest(f"tools[{i}]: only function tools are supported")
        tools.append({"type": "function", "function": {
            "name": _string(tool.get("name"), f"tools[{i}].name"),
            "description": tool.get("description") or "",
            "parameters": tool.get("parameters") or {"type": "object", "properties": {}}}})
    return _chat(body, messages, tools, body.get("max_output_tokens"), None)


def responses_reply(captured: Captured, model: str) -> JSON:
    """The answered call as an OpenAI Response object."""
    output: list[JSON] = []
    if captured.content or not captured.tool_calls:
        output.append({"type": "message", "id": f"msg_{uuid.uuid4().hex}",
                       "status": "completed", "role": "assistant",
                       "content": [{"type": "output_text", "text": captured.content,
                                    "annotations": []}]})
    output += [{"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call.id,
                "name": call.name, "arguments": call.arguments, "status": "completed"}
               for call in captured.tool_calls]
    prompt, sampled = len(captured.prompt_ids), len(captured.completion.token_ids)
    cut = captured.finish_reason == "length"
    return {"id": f"resp_{uuid.uuid4().hex}", "object": "response",
            "created_at": int(time.time()), "model": model,
            "status": "incomplete" if cut else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "output": output, "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "usage": {"input_tokens": prompt, "output_tokens": sampled,
                      "total_tokens": prompt + sampled,
                      "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens_details": {"reasoning_tokens": 0}}}


# ---- Anthropic Messages -----------------------------------------------------------------------

def chat_from_messages(body: JSON) -> ChatRequest:
    """POST /v1/messages as the chat request it means."""
    messages: list[JSON] = []
    if body.get("system"):
        messages.append({"role": "system",
                         "content": _texts(body["system"], ("text",), "system")})
    for i, message in enumerate(_list(body.get("messages"), "messages")):
        message, where = _object(message, f"messages[{i}]"), f"messages[{i}]"
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise BadRequest(f"{where} has an unknown role {role!r}")
        content = message.get("content")
        if isinstance(content, str):
            messages.append({"role": role, "content": content})
            continue
        texts: list[str] = []
        calls: list[JSON] = []
        for j, block in enumerate(_list(content, f"{where}.content")):
            block, at = _object(block, f"{where}.content[{j}]"), f"{where}.content[{j}]"
            kind = block.get("type")
            if kind == "text":
                texts.append(_string(block.get("text"), f"{at}.text"))
            elif kind == "tool_use" and role == "assistant":
                calls.append(_call(_string(block.get("id"), f"{at}.id"),
                                   _string(block.get("name"), f"{at}.name"),
                                   json.dumps(_object(block.get("input", {}), f"{at}.input"))))
            elif kind == "tool_result" and role == "user":
                result = block.get("content", "")
                messages.append({"role": "tool",
                                 "tool_call_id": _string(block.get("tool_use_id"),
                                                         f"{at}.tool_use_id"),
                                 "content": _texts(result, ("text",), f"{at}.content")})
            else:
                raise BadRequest(f"{at}: {kind!r} blocks are not supported here")
        if role == "assistant":
            messages.append({"role": "assistant", "content": "".join(texts),
                             **({"tool_calls": calls} if calls else {})})
        elif texts:
            messages.append({"role": "user", "content": "".join(texts)})
    tools = [{"type": "function", "function": {
        "name": _string(_object(tool, f"tools[{i}]").get("name"), f"tools[{i}].name"),
        "description": tool.get("description") or "",
        "parameters": tool.get("input_schema") or {"type": "object", "properties": {}}}}
        for i, tool in enumerate(_list(body.get("tools") or [], "tools"))]
    return _chat(body, messages, tools, body.get("max_tokens"), body.get("stop_sequences"))


def messages_reply(captured: Captured, model: str) -> JSON:
    """The answered call as an Anthropic Message."""
    content: list[JSON] = []
    if captured.content or not captured.tool_calls:
        content.append({"type": "text", "text": captured.content})
    for call in captured.tool_calls:
        try:
            arguments = json.loads(call.arguments)
        except ValueError:
            arguments = {}
        content.append({"type": "tool_use", "id": call.id, "name": call.name,
                        "input": arguments if isinstance(arguments, dict) else {}})
    stop = {"tool_calls": "tool_use", "length": "max_tokens"}.get(captured.finish_reason,
                                                                  "end_turn")
    return {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant",
            "model": model, "content": content, "stop_reason": stop, "stop_sequence": None,
            "usage": {"input_tokens": len(captured.prompt_ids),
                      "output_tokens": len(captured.completion.token_ids)}}


def anthropic_error(status: int, message: str) -> JSON:
    """An error in Anthropic's shape (its clients read `error.type` and `error.message`)."""
    kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
            413: "request_too_large", 429: "rate_limit_error"}.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}
