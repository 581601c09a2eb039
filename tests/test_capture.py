"""The capture proxy against the real embedded server (a tiny random model), through the real
openai SDK: token-exact turns, segments on history rewrites, tool calls, isolation, bad input."""

from __future__ import annotations

import json

import aiohttp
import openai
import pytest
from transformers import AutoTokenizer

from skyrl_agent.capture import CaptureProxy
from skyrl_agent.inference.bounds import (
    MAX_LOGPROBS,
    MAX_MESSAGES,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    MAX_TOOLS,
)
from skyrl_agent.inference.client import InferenceClient
from skyrl_agent.inference.process import embedded_server
from skyrl_agent.llm.session import LLMSession, SessionConfig
from tests.scripted_server import ScriptedServer, replies
from tests.tap_server import TapServer

SYSTEM = {"role": "system", "content": "You are terse."}


@pytest.fixture(scope="module")
def server_url(tiny_model_dir):
    with embedded_server(str(tiny_model_dir)) as process:
        yield process.url


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def session(client, tokenizer, **config) -> LLMSession:
    settings = SessionConfig(**{"max_tokens": 12, "max_context_tokens": 512, **config})
    return LLMSession(client, tokenizer, settings, seed=7)


def client_for(handle) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=handle.base_url, api_key="unused", max_retries=0)


def assert_recorded_what_the_server_sampled(llm: LLMSession, tap: TapServer) -> None:
    turns = [t for s in llm.segments for t in s.turns]
    calls = tap.sampled()
    assert len(turns) == len(calls) > 0
    recorded = sorted((list(t.prompt_ids), list(t.completion_ids), list(t.completion_logprobs))
                      for t in turns)
    assert recorded == sorted(calls)
    for segment in llm.segments:
        assert segment.is_token_consistent()
        for turn in segment.turns:
            assert len(turn.completion_logprobs) == len(turn.completion_ids) > 0


async def test_a_conversation_is_one_token_exact_segment(server_url, tokenizer):
    async with (TapServer(server_url) as tap, InferenceClient([tap.url]) as client,
                CaptureProxy() as proxy):
        llm = session(client, tokenizer)
        handle = proxy.open(llm)
        agent = client_for(handle)
        messages = [SYSTEM, {"role": "user", "content": "Say hi."}]
        for turn in range(4):
            reply = await agent.chat.completions.create(model="m", messages=messages,
                                                        max_tokens=8)
            message = reply.choices[0].message
            assert reply.usage.completion_tokens == len(
                llm.segments[-1].turns[-1].completion_ids)
            messages += [{"role": "assistant", "content": message.content},
                         {"role": "user", "content": f"Observation {turn}: ok"}]
    (segment,) = llm.segments
    assert len(segment.turns) == 4 and handle.session.stats.segment_breaks == 0
    assert_recorded_what_the_server_sampled(llm, tap)
    # The prompt after a reply is the reply's sampled ids, not the reply's text re-tokenized.
    first, second = segment.turns[:2]
    assert second.prompt_ids[: len(first.prompt_ids) + len(first.completion_ids)] == (
        first.prompt_ids + first.completion_ids)


async def test_history_rewrites_open_segments_and_are_counted(server_url, tokenizer):
    async with (TapServer(server_url) as tap, InferenceClient([tap.url]) as client,
                CaptureProxy() as proxy):
        llm = session(client, tokenizer)
        handle = proxy.open(llm)
        agent = client_for(handle)

        async def ask(messages):
            reply = await agent.chat.completions.create(model="m", messages=messages)
            return {"role": "assistant", "content": reply.choices[0].message.content}

        start = [SYSTEM, {"role": "user", "content": "Task: count to three."}]
        first = await ask(start)
        long = [*start, first, {"role": "user", "content": "go on"}]
        long.append(await ask(long))
        # Compaction: the history is replaced by a summary; then the agent goes on from it.
        compact = [SYSTEM, {"role": "user", "content": "Task: count to three. Summary: 1, 2."}]
        compact.append(await ask(compact))
        await ask([*compact, {"role": "user", "content": "continue"}])
        # A fork: the first reply kept, a different observation after it.
        await ask([*start, first, {"role": "user", "content": "something else"}])
    stats = handle.session.stats
    assert [len(s.turns) for s in llm.segments] == [2, 2, 1]
    assert stats.segment_breaks == 2 and stats.prefix_reused == 1
    fork = llm.segments[2].turns[0]
    head = llm.segments[0].turns[0]
    assert fork.prompt_ids[: len(head.prompt_ids) + len(head.completion_ids)] == (
        head.prompt_ids + head.completion_ids)
    assert_recorded_what_the_server_sampled(llm, tap)


async def test_text_completions_extend_by_ids(server_url, tokenizer):
    async with (TapServer(server_url) as tap, InferenceClient([tap.url]) as client,
                CaptureProxy() as proxy):
        llm = session(client, tokenizer)
        handle = proxy.open(llm)
        agent = client_for(handle)
        text = "Once upon a time"
        for _ in range(3):
            reply = await agent.completions.create(model="m", prompt=text, max_tokens=6)
            text += reply.choices[0].text + " and then"
    (segment,) = llm.segments
    assert len(segment.turns) == 3 and segment.is_token_consistent()
    assert_recorded_what_the_server_sampled(llm, tap)


async def test_tool_calls_come_back_as_openai_tool_calls_and_extend_the_segment(tokenizer):
    call = "Let me look.\n<function=execute_bash>\n<parameter=command>ls -la</parameter>\n" \
           "<parameter=timeout>30</parameter>\n</function>"
    tools = [{"type": "function", "function": {
        "name": "execute_bash", "description": "Run a command.",
        "parameters": {"type": "object", "properties": {
            "command": {"type": "string"}, "timeout": {"type": "number"}}}}}]
    async with (ScriptedServer(tokenizer, replies(call, "All done.")) as server,
                InferenceClient([server.url]) as client, CaptureProxy() as proxy):
        llm = session(client, tokenizer, max_tokens=64)
        handle = proxy.open(llm)
        agent = client_for(handle)
        messages = [SYSTEM, {"role": "user", "content": "List the files."}]
        reply = await agent.chat.completions.create(model="m", messages=messages, tools=tools)
        choice = reply.choices[0]
        (tool_call,) = choice.message.tool_calls
        assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me look."
        assert tool_call.function.name == "execute_bash"
        assert json.loads(tool_call.function.arguments) == {"command": "ls -la", "timeout": 30}
        messages += [choice.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": tool_call.id, "content": "a.txt"}]
        final = await agent.chat.completions.create(model="m", messages=messages, tools=tools)
    answer = final.choices[0].message
    assert answer.content == "All done." and not answer.tool_calls
    (segment,) = llm.segments  # the echoed tool call matched the reply: no rewrite
    first = segment.turns[0]
    assert "execute_bash" in tokenizer.decode(first.prompt_ids)  # described: no template support
    assert server.prompts[1][: len(first.prompt_ids) + len(first.completion_ids)] == list(
        first.prompt_ids + first.completion_ids)
    assert "<|im_start|>tool\na.txt" in tokenizer.decode(segment.turns[1].prompt_ids)


async def test_a_re_tokenizing_gateway_would_have_trained_on_other_tokens(tokenizer):
    """The model sampled `hello` as two tokens; re-tokenizing the text gives one. The proxy
    keeps the sampled ids, and counts what re-tokenizing would have changed."""
    def split(text: str) -> list[int]:
        return [i for ch in text for i in tokenizer.encode(ch, add_special_tokens=False)]

    async with (ScriptedServer(tokenizer, replies("hello world", "fine"), encode=split) as server,
                InferenceClient([server.url]) as client, CaptureProxy() as proxy):
        llm = session(client, tokenizer)
        handle = proxy.open(llm)
        agent = client_for(handle)
        messages = [SYSTEM, {"role": "user", "content": "greet"}]
        reply = await agent.chat.completions.create(model="m", messages=messages)
        messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                     {"role": "user", "content": "again"}]
        await agent.chat.completions.create(model="m", messages=messages)
    (segment,) = llm.segments
    sampled = [*split("hello world"), tokenizer.eos_token_id]
    assert list(segment.turns[0].completion_ids) == sampled
    assert list(segment.turns[1].prompt_ids[len(segment.turns[0].prompt_ids):][:len(sampled)]) \
        == sampled
    tokens, segments = handle.session.retokenization()
    assert tokens > 0 and segments == 1


async def test_keys_isolate_sessions_and_bad_input_is_refused(tokenizer):
    async with (ScriptedServer(tokenizer, replies("a", "b", "c")) as server,
                InferenceClient([server.url]) as client, CaptureProxy(max_body_bytes=4096) as proxy,
                aiohttp.ClientSession() as http):
        one, two = session(client, tokenizer), session(client, tokenizer)
        first, second = proxy.open(one), proxy.open(two)
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

        async def post(url, body, key=None, raw=None):
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            async with http.post(url, json=None if raw else body, data=raw,
                                 headers=headers) as response:
                return response.status, await response.json(content_type=None)

        assert (await post(f"{first.base_url}/chat/completions", chat))[0] == 200
        status, body = await post(f"{proxy.url}/v1/chat/completions", chat, key=second.key)
        assert status == 200 and body["choices"][0]["message"]["content"] == "b"
        assert [len(s.turns) for s in one.segments] == [1]
        assert [len(s.turns) for s in two.segments] == [1]
        refused = [
            await post(f"{proxy.url}/s/not-a-key/v1/chat/completions", chat),
            await post(f"{proxy.url}/v1/chat/completions", chat),
            await post(f"{proxy.url}/v1/chat/completions", chat, key="x" * 500),
            await post(f"{first.base_url}/chat/completions", {**chat, "n": 2}),
            await post(f"{first.base_url}/chat/completions", {**chat, "stream": True}),
            await post(f"{first.base_url}/chat/completions", {"model": "m", "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}),
            await post(f"{first.base_url}/chat/completions", {"messages": [{"role": "bot"}]}),
            await post(f"{first.base_url}/chat/completions", {}, raw=b"{not json"),
            await post(f"{first.base_url}/chat/completions",
                       {**chat, "messages": [{"role": "user", "content": "x" * 8192}]}),
        ]
        assert [status for status, _ in refused] == [401, 401, 401, 400, 400, 400, 400, 400, 413]
        assert all("message" in body["error"] for _, body in refused)
        proxy.close(first)
        assert (await post(f"{first.base_url}/chat/completions", chat))[0] == 401
        assert (await post(f"{second.base_url}/chat/completions", chat))[0] == 200
    assert sum(len(s.turns) for s in one.segments) == 1  # nothing refused was recorded
    assert sum(len(s.turns) for s in two.segments) == 2


async def test_every_request_field_is_bounded_in_every_format(tokenizer):
    """Stops a sandboxed agent from sending what the model server pays for after every token
    or per sequence: each field at bound + 1 is refused with one line, in the chat, text,
    Responses and Messages formats (a single stop string of any length was taken); fields the
    proxy does not forward (stop_token_ids, logit_bias) are ignored."""
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    over = [
        ("chat/completions", {**chat, "stop": ["x"] * (MAX_STOP_STRINGS + 1)}, "stop strings"),
        ("chat/completions", {**chat, "stop": "x" * (MAX_STOP_CHARS + 1)}, "stop strings"),
        ("chat/completions", {**chat, "n": 2}, "n must be 1"),
        ("chat/completions", {**chat, "tools": [{}] * (MAX_TOOLS + 1)}, "at most 256 items"),
        ("chat/completions", {**chat, "messages": chat["messages"] * (MAX_MESSAGES + 1)},
         "at most 4096 items"),
        ("completions", {"prompt": "hi", "logprobs": MAX_LOGPROBS + 1}, "logprobs"),
        ("completions", {"prompt": "hi", "stop": "x" * (MAX_STOP_CHARS + 1)}, "stop strings"),
        ("completions", {"prompt": ["hi", "ho"]}, "give one prompt"),
        ("messages", {"model": "m", "max_tokens": 4, "messages": chat["messages"],
                      "stop_sequences": ["x"] * (MAX_STOP_STRINGS + 1)}, "stop strings"),
        ("responses", {"model": "m", "input": "hi", "tools": [
            {"type": "function", "name": "f"}] * (MAX_TOOLS + 1)}, "at most 256 items"),
        ("responses", {"model": "m", "input": [{"role": "user", "content": "hi"}]
                       * (MAX_MESSAGES + 1)}, "at most 4096 items"),
    ]
    async with (ScriptedServer(tokenizer, replies("a")) as server,
                InferenceClient([server.url]) as client, CaptureProxy() as proxy,
                aiohttp.ClientSession() as http):
        handle = proxy.open(session(client, tokenizer))
        for path, body, words in over:
            async with http.post(f"{handle.base_url}/{path}", json=body) as response:
                reply = await response.json()
            message = reply["error"]["message"]
            assert response.status == 400 and words in message, (path, message)
            assert "\n" not in message
        ignored = {"stop_token_ids": list(range(10**5)), "logit_bias": {"1": 100}}
        async with http.post(f"{handle.base_url}/chat/completions",
                             json={**chat, **ignored}) as response:
            assert response.status == 200
        assert len(server.prompts) == 1  # nothing refused reached the model server


async def test_a_prompt_past_the_context_is_an_openai_context_error(tokenizer, monkeypatch):
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    async with (ScriptedServer(tokenizer, replies("x")) as server,
                InferenceClient([server.url]) as client, CaptureProxy() as proxy):
        llm = session(client, tokenizer, max_context_tokens=256)
        handle = proxy.open(llm)
        messages = [{"role": "user", "content": "word " * 400}]
        with pytest.raises(litellm.ContextWindowExceededError):
            await litellm.acompletion(model="openai/m", api_base=handle.base_url,
                                      api_key="unused", messages=messages, num_retries=0)
    assert handle.session.stats.context_overflows == 1 and not llm.segments


def test_a_black_box_agent_without_its_package_is_one_error_line(tmp_path):
    import subprocess
    import sys

    code = ("import sys; sys.modules['minisweagent'] = None\n"
            "from skyrl_agent.cli import main; main()")
    result = subprocess.run([sys.executable, "-c", code, "rollout", "--agent", "mini-swe-agent",
                             "--output", str(tmp_path / "run")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.startswith("error: the mini-swe-agent agent needs the minisweagent")
    assert "`agents` extra" in result.stderr and len(result.stderr.splitlines()) == 1
    assert not (tmp_path / "run").exists()
