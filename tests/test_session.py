"""LLMSession and ChatRenderer units: incremental rendering equals a full render; budgets."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from skyrl_agent.agents.rendering import ChatRenderer, TemplateError
from skyrl_agent.agents.session import ContextOverflow, LLMSession, SessionConfig
from skyrl_agent.inference.client import InferenceClient
from tests.scripted_server import ScriptedServer, replies


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    return AutoTokenizer.from_pretrained(smollm2_dir)


CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "List the files."},
    {"role": "assistant", "content": "ls -la"},
    {"role": "user", "content": "total 0\ndrwxr-xr-x 2 root root 40 ."},
    {"role": "assistant", "content": "Done: the folder is empty."},
    {"role": "tool", "content": "exit code 0"},
]


def test_incremental_rendering_equals_a_full_render(tokenizer):
    renderer = ChatRenderer(tokenizer)
    ids = renderer.start(CONVERSATION[:2])
    eos = tokenizer.eos_token_id
    for reply, following in [(CONVERSATION[2], CONVERSATION[3:4]),
                             (CONVERSATION[4], CONVERSATION[5:6])]:
        completion = [*tokenizer.encode(reply["content"], add_special_tokens=False), eos]
        ids = ids + completion + renderer.extend(completion, following)
    full = tokenizer.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert ids == tokenizer.encode(full, add_special_tokens=False)


def test_a_truncated_completion_is_closed_before_new_messages(tokenizer):
    renderer = ChatRenderer(tokenizer)
    cut = tokenizer.encode("ls -", add_special_tokens=False)  # no end-of-turn token sampled
    added = tokenizer.decode(renderer.extend(cut, [{"role": "user", "content": "go on"}]))
    assert added.startswith(tokenizer.eos_token + "\n<|im_start|>user\ngo on")


def test_templates_without_chat_support_are_refused(tokenizer, tiny_model_dir):
    plain = AutoTokenizer.from_pretrained(tiny_model_dir)
    plain.chat_template = None
    with pytest.raises(TemplateError, match="no chat template"):
        ChatRenderer(plain)


async def test_session_records_a_growing_token_sequence(tokenizer):
    async with (ScriptedServer(tokenizer, replies("first", "second", "third")) as server,
                InferenceClient([server.url]) as client):
        session = LLMSession(client, tokenizer, SessionConfig(max_tokens=50))
        await session.chat(CONVERSATION[:2])
        await session.chat([{"role": "user", "content": "more"}])
        reply = await session.chat([{"role": "user", "content": "again"}])
    assert reply.text == "third"
    (segment,) = session.segments
    assert segment.is_token_consistent() and len(segment.turns) == 3
    assert [list(t.prompt_ids) for t in segment.turns] == server.prompts
    assert session.drift_tokens() == 0  # every reply ended cleanly: nothing to drift
    assert session.metrics()["completion_tokens"] == sum(
        len(t.completion_ids) for t in segment.turns)


async def test_a_first_prompt_beyond_the_context_overflows(tokenizer):
    async with (ScriptedServer(tokenizer, replies("x")) as server,
                InferenceClient([server.url]) as client):
        session = LLMSession(client, tokenizer, SessionConfig(max_context_tokens=256))
        with pytest.raises(ContextOverflow):
            await session.chat([{"role": "user", "content": "word " * 400}])
