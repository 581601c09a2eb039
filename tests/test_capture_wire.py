"""The Responses and Messages wire formats (capture/wire.py), pure and fast: each request means
the chat request it should, a reply echoed back in the same format is the very message that was
returned (so its conversation continues the same segment), and what a recorded chat turn cannot
hold is refused, not dropped."""

from __future__ import annotations

import json

import pytest

from skyrl_agent.capture.messages import BadRequest, Call, ChatMessage, parse_messages
from skyrl_agent.capture.recorder import Captured
from skyrl_agent.capture.wire import (
    chat_from_messages,
    chat_from_responses,
    messages_reply,
    responses_reply,
)
from skyrl_agent.inference.client import Completion

CALL = Call("call_1", "bash", json.dumps({"command": "ls -la", "timeout": 5}))


def captured(content: str, calls: tuple[Call, ...] = (), finish: str = "stop") -> Captured:
    completion = Completion((5, 6, 7), (-0.1, -0.2, -0.3), (0, 0, 0), finish, "raw", "s")
    return Captured(completion, (1, 2, 3, 4), content, calls)


def keys(request) -> list[tuple]:
    return [m.key() for m in parse_messages(request.messages)]


@pytest.mark.parametrize("calls", [(), (CALL,)])
def test_a_responses_reply_echoed_back_is_the_message_returned(calls):
    reply = responses_reply(captured("I will look." if calls else "Done.", calls), "m")
    assert reply["status"] == "completed" and reply["usage"]["output_tokens"] == 3
    body = {"instructions": "be brief", "tools": [
        {"type": "function", "name": "bash", "parameters": {"type": "object"}}],
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "list it"}]},
                  *reply["output"],
                  *([{"type": "function_call_output", "call_id": "call_1", "output": "a b"}]
                    if calls else [{"role": "user", "content": "thanks"}])]}
    request = chat_from_responses(body)
    returned = ChatMessage("assistant", "I will look." if calls else "Done.", calls)
    assert keys(request)[:3] == [("system", "be brief", (), None),
                                 ("user", "list it", (), None), returned.key()]
    assert request.tools == [{"type": "function", "function": {
        "name": "bash", "description": "", "parameters": {"type": "object"}}}]
    last = parse_messages(request.messages)[-1]
    assert (last.role, last.tool_call_id) == (("tool", "call_1") if calls else ("user", None))


@pytest.mark.parametrize("calls", [(), (CALL,)])
def test_a_messages_reply_echoed_back_is_the_message_returned(calls):
    reply = messages_reply(captured("" if calls else "Done.", calls), "m")
    assert reply["stop_reason"] == ("tool_use" if calls else "end_turn")
    follow = ([{"type": "tool_result", "tool_use_id": "call_1",
                "content": [{"type": "text", "text": "a b"}]}] if calls else "thanks")
    body = {"system": [{"type": "text", "text": "be brief"}], "max_tokens": 64,
            "stop_sequences": ["</done>"],
            "tools": [{"name": "bash", "input_schema": {"type": "object"}}],
            "messages": [{"role": "user", "content": "list it"},
                         {"role": "assistant", "content": reply["content"]},
                         {"role": "user", "content": follow}]}
    request = chat_from_messages(body)
    returned = ChatMessage("assistant", "" if calls else "Done.", calls)
    assert keys(request)[:3] == [("system", "be brief", (), None),
                                 ("user", "list it", (), None), returned.key()]
    assert request.max_tokens == 64 and request.stop_strings == ("</done>",)
    last = parse_messages(request.messages)[-1]
    assert (last.role, last.content) == (("tool", "a b") if calls else ("user", "thanks"))


def test_a_cut_reply_says_so_in_each_format():
    assert responses_reply(captured("par", finish="length"), "m")["status"] == "incomplete"
    assert messages_reply(captured("par", finish="length"), "m")["stop_reason"] == "max_tokens"


@pytest.mark.parametrize("convert, body, needle", [
    (chat_from_responses, {"input": "hi", "previous_response_id": "resp_1"},
     "previous_response_id"),
    (chat_from_responses, {"input": [{"type": "reasoning", "summary": []}]}, "reasoning"),
    (chat_from_responses, {"input": "hi", "tools": [{"type": "web_search"}]}, "function"),
    (chat_from_responses, {"input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "x"}]}]}, "input_image"),
    (chat_from_messages, {"messages": [{"role": "user", "content": [
        {"type": "image", "source": {}}]}], "max_tokens": 8}, "image"),
    (chat_from_messages, {"messages": [{"role": "user", "content": [
        {"type": "tool_use", "id": "x", "name": "n", "input": {}}]}], "max_tokens": 8},
     "tool_use"),
    (chat_from_messages, {"messages": "hi", "max_tokens": 8}, "list"),
])
def test_what_a_chat_turn_cannot_hold_is_refused(convert, body, needle):
    with pytest.raises(BadRequest, match=needle):
        convert(body)


def test_streaming_is_refused_in_every_format():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="stream"):
        chat_from_responses({"input": "hi", "stream": True})
    with pytest.raises(ValidationError, match="stream"):
        chat_from_messages({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                            "stream": True})
