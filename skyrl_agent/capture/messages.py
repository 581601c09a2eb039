"""OpenAI request bodies as the proxy accepts them, and chat messages in one comparable form.

Request bodies come from agent code driven by model output, so they are untrusted: fields the
proxy does not use are ignored (clients send many), the ones it uses are validated, and sizes
are bounded. Messages are reduced to what a chat template reads (role, text, tool calls, tool
call id, name), so the echo of a reply the proxy returned compares equal to that reply whatever
extra keys a client library adds.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from skyrl_agent.inference.bounds import MAX_LOGPROBS, MAX_MESSAGES, MAX_TOOLS, check_stop

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


class BadRequest(ValueError):
    """A request the proxy refuses with a 400 and this message."""


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    model: str = ""
    max_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    return_token_ids: bool = False
    """vLLM's flag: also return the prompt and completion ids (they are the recorded ones)."""

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int) -> int:
        if value != 1:
            raise ValueError("n must be 1: a session records one sequence")
        return value

    @field_validator("stream")
    @classmethod
    def _no_stream(cls, value: bool) -> bool:
        if value:
            raise ValueError("streaming is not supported by the capture proxy; use stream=false")
        return value

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        check_stop(value)
        return value

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if isinstance(self.stop, str):
            return (self.stop,)
        return tuple(s for s in self.stop or () if s)


class ChatRequest(_Request):
    """POST /v1/chat/completions."""

    messages: list[dict[str, Any]] = Field(min_length=1, max_length=MAX_MESSAGES)
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: str | dict[str, Any] | None = None
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = False

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def wants_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"


class TextRequest(_Request):
    """POST /v1/completions (text prompts; token-id prompts would bypass the recording)."""

    prompt: str | list[str]
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)

    @property
    def text(self) -> str:
        if isinstance(self.prompt, str):
            return self.prompt
        if len(self.prompt) != 1:
            raise BadRequest("give one prompt: a session records one sequence")
        return self.prompt[0]


@dataclass(frozen=True)
class Call:
    """One tool call, as returned to the agent or echoed back by it."""

    id: str
    name: str
    arguments: str
    """JSON text, as OpenAI sends it."""

    def key(self) -> tuple[str, str]:
        try:  # clients may re-serialize the arguments: compare their meaning
            canonical = json.dumps(json.loads(self.arguments), sort_keys=True)
        except ValueError:
            canonical = self.arguments
        return self.name, canonical

    def openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ChatMessage:
    """A chat message reduced to what templates read."""

    role: str
    content: str
    tool_calls: tuple[Call, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None

    def key(self) -> tuple[Any, ...]:
        """What must be equal for two messages to be the same turn of a conversation (tool
        call ids are left out: they name calls, they are not what the model read)."""
        return (self.role, self.content, tuple(c.key() for c in self.tool_calls), self.name)

    def template_form(self, native_tools: bool) -> dict[str, Any]:
        """The dict handed to the chat template. A template that cannot show tool calls gets
        them as text in the function format the model is asked to write."""
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls and native_tools:
            message["tool_calls"] = [
                {**c.openai(), "function": {"name": c.name, "arguments": _loaded(c.arguments)}}
                for c in self.tool_calls]
        elif self.tool_calls:
            message["content"] = calls_as_text(self.content, self.tool_calls)
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            message["name"] = self.name
        return message


def _loaded(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def _text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in ("text", "input_text"):
                raise BadRequest(f"{where}: only text content parts are supported")
            text = part.get("text")
            if not isinstance(text, str):
                raise BadRequest(f"{where}: a text part needs a string `text`")
            parts.append(text)
        return "".join(parts)
    raise BadRequest(f"{where}: content must be a string or a list of text parts")


def _calls(raw: Any, where: str) -> tuple[Call, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise BadRequest(f"{where}: tool_calls must be a list")
    calls = []
    for i, call in enumerate(raw):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise BadRequest(f"{where}.tool_calls[{i}] needs function.name")
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        calls.append(Call(str(call.get("id") or ""), function["name"], arguments))
    return tuple(calls)


def parse_messages(raw: list[dict[str, Any]]) -> list[ChatMessage]:
    """The request's messages in comparable form; BadRequest names the first bad one."""
    messages = []
    for i, message in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise BadRequest(f"{where} must be an object")
        role = message.get("role")
        if role not in ROLES:
            raise BadRequest(f"{where} has an unknown role {role!r}")
        tool_call_id = message.get("tool_call_id")
        name = message.get("name")
        messages.append(ChatMessage(
            role=role, content=_text(message.get("content"), where),
            tool_calls=_calls(message.get("tool_calls"), where),
            tool_call_id=str(tool_call_id) if tool_call_id is not None else None,
            name=name if isinstance(name, str) else None))
    return messages


def calls_as_text(content: str, calls: Sequence[Call]) -> str:
    """A reply with tool calls written out in the function format (what the model writes)."""
    parts = [content] if content else []
    for call in calls:
        try:
            arguments = json.loads(call.arguments)
        except ValueError:
            arguments = {}
        params = "".join(f"<parameter={key}>{_plain(value)}</parameter>\n"
                         for key, value in (arguments.items() if isinstance(arguments, dict)
                                            else []))
        parts.append(f"<function={call.name}>\n{params}</function>")
    return "\n".join(parts)


def _plain(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)
