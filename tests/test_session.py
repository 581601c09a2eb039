"""LLMSession and ChatRenderer units: incremental rendering equals a full render; budgets."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import time

import pytest
from transformers import AutoTokenizer

from skyrl_agent.inference.client import InferenceClient
from skyrl_agent.llm.rendering import ChatRenderer, TemplateError
from skyrl_agent.llm.session import (
    SUMMARY_HEADER,
    TRUNCATE_TO,
    ContextOverflow,
    LLMSession,
    SessionConfig,
    TokenBudgetSpent,
    differing_tokens,
)
from skyrl_agent.types import FinishReason
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


def test_plain_messages_are_written_from_a_learned_shape_as_the_template_writes_them(tokenizer):
    renderer = ChatRenderer(tokenizer)
    shape = renderer.role_shape("user")
    assert shape is not None and shape.before == "<|im_start|>user\n"
    contents = ["ok", " $ ls\n\ta  b ", "{% if x %}{{ y }}", "\u00e9\n\n<|im_start|>", ""]
    for messages in ([{"role": "user", "content": c}] for c in contents):
        assert renderer.new_messages(messages) == renderer._rendered_after_reply(messages)
    several = [{"role": "tool", "content": c} for c in contents]
    assert renderer.new_messages(several) == renderer._rendered_after_reply(several)
    renderer._text = None  # learned: no template render for plain messages any more
    assert renderer.new_messages([{"role": "user", "content": "x"}]).startswith(shape.before)


WRAPPED = ("{% for m in messages %}<{{ m['role'] }}>BODY</{{ m['role'] }}>{% endfor %}"
           "{% if add_generation_prompt %}<assistant>{% endif %}")


@pytest.mark.parametrize("body", [
    "{{ m['content'] | trim }}",
    "{% if m['content'].startswith('<tool_response>') %}[tool]{% endif %}{{ m['content'] }}",
    "{{ m['content'] | replace('<think>', '') }}",
    "{% if m['content'] %}{{ m['content'] }}{% else %}(empty){% endif %}",
], ids=["trims", "branches-on-tool-responses", "rewrites", "branches-on-empty"])
def test_a_template_that_changes_a_content_gets_no_shape_and_is_rendered(tokenizer, body):
    custom = copy.deepcopy(tokenizer)
    custom.chat_template = WRAPPED.replace("BODY", body)
    renderer = ChatRenderer(custom)
    assert renderer.role_shape("user") is None
    message = [{"role": "user", "content": "  <tool_response>x</tool_response> "}]
    assert renderer.new_messages(message) == renderer._rendered_after_reply(message)


def test_a_message_with_more_than_a_role_and_a_text_is_rendered_by_the_template(tokenizer):
    renderer = ChatRenderer(tokenizer)
    assert renderer.role_shape("tool") is not None
    rendered, real = [], renderer._text
    renderer._text = lambda messages, prompt: rendered.append(messages) or real(messages, prompt)
    renderer.new_messages([{"role": "tool", "content": "x", "name": "run"}])
    renderer.new_messages([{"role": "tool", "content": "x"}, {"role": "user", "content": "y"}])
    assert len(rendered) == 2  # neither took a shape: one has a name, the other two roles
    renderer.new_messages([{"role": "tool", "content": "x"}])
    assert len(rendered) == 2


def test_a_template_is_learned_once_for_every_session_of_its_tokenizer_and_tools(tokenizer):
    """Sessions share what the probes learned (a session starts without a template render),
    but only with the same template and tool list: others learn their own."""
    custom = copy.deepcopy(tokenizer)
    ChatRenderer(custom).role_shape("user")
    renders = []
    real = custom.apply_chat_template
    custom.apply_chat_template = lambda *a, **k: renders.append(k.get("tools")) or real(*a, **k)
    assert ChatRenderer(custom).role_shape("user") is not None and renders == []
    tools = [{"type": "function", "function": {"name": "run", "description": "Run it.",
                                               "parameters": {"type": "object"}}}]
    with_tools = ChatRenderer(custom, tools)
    assert renders and all(rendered == tools for rendered in renders)
    message = [{"role": "user", "content": "ok"}]
    assert with_tools.new_messages(message) == with_tools._rendered_after_reply(message)
    custom.chat_template = WRAPPED.replace("BODY", "{{ m['content'] | trim }}")
    assert ChatRenderer(custom).role_shape("user") is None  # not ChatML's shape


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


async def test_model_time_counts_every_call_and_the_wait_for_a_free_slot(tokenizer):
    async with (ScriptedServer(tokenizer, replies("first", "second")) as server,
                InferenceClient([server.url]) as client):
        session = LLMSession(client, tokenizer, SessionConfig(max_tokens=50))
        session.limiter = asyncio.Semaphore(1)
        await session.chat(CONVERSATION[:2])
        (first,) = session.segments[0].turns
        assert session.model_time_s >= first.latency_s > 0
        await session.limiter.acquire()  # another session holds the only slot for 0.3 s
        asyncio.get_running_loop().call_later(0.3, session.limiter.release)
        await session.chat([{"role": "user", "content": "more"}])
    latencies = sum(t.latency_s for t in session.segments[0].turns)
    assert session.model_time_s >= latencies + 0.3


async def test_a_first_prompt_beyond_the_context_overflows(tokenizer):
    async with (ScriptedServer(tokenizer, replies("x")) as server,
                InferenceClient([server.url]) as client):
        session = LLMSession(client, tokenizer, SessionConfig(max_context_tokens=256))
        with pytest.raises(ContextOverflow):
            await session.chat([{"role": "user", "content": "word " * 400}])


async def test_the_next_prompt_extends_the_sampled_ids_not_a_retokenization(tokenizer):
    """Stops: re-tokenizing the whole history each turn. The server samples "Hello" as the two
    tokens "Hel" + "lo" (not the canonical single token); the next prompt must carry exactly
    those sampled ids, which a re-render of the text would replace."""
    (hello,) = tokenizer.encode("Hello", add_special_tokens=False)
    split = [*tokenizer.encode("Hel", add_special_tokens=False),
             *tokenizer.encode("lo", add_special_tokens=False)]
    assert len(split) == 2 and tokenizer.decode(split) == "Hello"  # same text, other ids
    eos = tokenizer.eos_token_id

    def sampled(text: str) -> list[int]:
        return list(split) if text == "Hello" else tokenizer.encode(text, add_special_tokens=False)

    async with (ScriptedServer(tokenizer, replies("Hello", "bye"), encode=sampled) as server,
                InferenceClient([server.url]) as client):
        session = LLMSession(client, tokenizer, SessionConfig(max_tokens=50))
        await session.chat(CONVERSATION[:2])
        await session.chat([{"role": "user", "content": "more"}])
    first, second = server.prompts
    assert second[: len(first) + 3] == [*first, *split, eos]
    assert hello not in second
    (segment,) = session.segments
    assert segment.turns[0].completion_ids == (*split, eos)
    assert segment.is_token_consistent()
    assert session.drift_tokens() > 0  # a re-render would have tokenized differently


async def test_max_tokens_is_clipped_to_the_room_left_in_the_context(tokenizer):
    """Stops: asking for config.max_tokens even when the context has less room left."""
    limit = len(ChatRenderer(tokenizer).start(CONVERSATION[:2])) + 7
    config = SessionConfig(max_context_tokens=limit, max_tokens=500, summarize_at=1.0,
                           min_completion_tokens=1)
    async with (ScriptedServer(tokenizer, replies("a b c d e f g h i j k")) as server,
                InferenceClient([server.url]) as client):
        reply = await LLMSession(client, tokenizer, config).chat(CONVERSATION[:2])
    assert server.max_tokens == [7]
    assert reply.finish_reason == FinishReason.LENGTH and reply.text == "a b c d e f g"


SYSTEM = {"role": "system", "content": "You are terse."}
TASK = {"role": "user", "content": "Fix the bug in main.py."}
LONG_REPLY = "I read every file in the folder and ran the tests once more. " * 6
OBSERVATION = {"role": "user", "content": "".join(f"line {i}: ok\n" for i in range(40))}
SUMMARY = "Summary: tests ran; main.py still fails."


def overflow_config(tokenizer, **overrides) -> SessionConfig:
    """A context exactly as long as [system, task, LONG_REPLY, OBSERVATION]: adding the
    observation after the long reply forces a summary, while the summary request fits and the
    restarted segment [system, task + summary, OBSERVATION] fits with room to reply."""
    renderer = ChatRenderer(tokenizer)
    head = renderer.start([SYSTEM, TASK])
    reply = [*tokenizer.encode(LONG_REPLY, add_special_tokens=False), tokenizer.eos_token_id]
    continued = [*head, *reply, *renderer.extend(reply, [OBSERVATION])]
    request = [*head, *reply, *renderer.extend(
        reply, [{"role": "user", "content": SessionConfig().summary_prompt}])]
    limit = len(continued)
    assert len(request) + 30 < limit  # room to write the summary
    return SessionConfig(max_context_tokens=limit, max_tokens=200, summarize_at=1.0,
                         min_completion_tokens=1, **overrides)


async def test_the_pending_observation_follows_the_summary(tokenizer):
    """Stops: dropping the new messages that triggered a summary. The restarted segment must be
    [system, task + summary] followed by exactly the pending observation."""
    async with (ScriptedServer(tokenizer, replies(LONG_REPLY, "next", summary=SUMMARY)) as server,
                InferenceClient([server.url]) as client):
        session = LLMSession(client, tokenizer, overflow_config(tokenizer))
        await session.chat([SYSTEM, TASK])
        reply = await session.chat([OBSERVATION])
    assert reply.text == "next" and session.summaries == 1
    restarted_task = {"role": "user",
                      "content": f"{TASK['content']}\n\n{SUMMARY_HEADER}\n{SUMMARY}"}
    expected = ChatRenderer(tokenizer).start([SYSTEM, restarted_task, OBSERVATION])
    assert server.prompts[-1] == expected
    first, second = session.segments
    assert first.summary_turn_index == len(first.turns) - 1 == 1
    assert list(second.turns[0].prompt_ids) == expected


async def test_max_summaries_is_enforced(tokenizer):
    """Stops: summarizing past config.max_summaries. With one allowed, the second overflow
    raises ContextOverflow without asking the model for another summary."""
    async with (ScriptedServer(tokenizer, replies(LONG_REPLY, "next", summary=SUMMARY)) as server,
                InferenceClient([server.url]) as client):
        session = LLMSession(client, tokenizer, overflow_config(tokenizer, max_summaries=1))
        await session.chat([SYSTEM, TASK])
        await session.chat([OBSERVATION])
        requests = len(server.prompts)
        with pytest.raises(ContextOverflow, match="after 1 summaries"):
            await session.chat([OBSERVATION])
    assert len(server.prompts) == requests and session.summaries == 1


async def test_no_summary_at_all_when_none_are_allowed(tokenizer):
    """Stops: the max_summaries bound being off by one (max_summaries=0 must never summarize)."""
    async with (ScriptedServer(tokenizer, replies(LONG_REPLY, summary=SUMMARY)) as server,
                InferenceClient([server.url]) as client):
        session = LLMSession(client, tokenizer, overflow_config(tokenizer, max_summaries=0))
        await session.chat([SYSTEM, TASK])
        with pytest.raises(ContextOverflow):
            await session.chat([OBSERVATION])
    assert len(server.prompts) == 1 and session.summaries == 0


async def test_truncation_drops_the_oldest_replies_and_asks_for_no_summary(tokenizer):
    """Stops: truncation that summarizes anyway, keeps the oldest turns instead of the newest,
    keeps more than half the context, or drops the pending observation. The new segment is the
    head, the longest run of newest exchanges (starting at a reply) within TRUNCATE_TO of the
    context, then the observation; the first segment's turns stay recorded."""
    short = [{"role": "user", "content": f"step {i} done"} for i in range(4)]
    texts = [f"reply number {i}: the tests pass and the files are in place. " * 2
             for i in range(5)]
    observation = {"role": "user", "content": "".join(f"line {i}: ok\n" for i in range(6))}
    renderer = ChatRenderer(tokenizer)
    async with (ScriptedServer(tokenizer, replies(*texts, "after")) as server,
                InferenceClient([server.url]) as client):
        history = [SYSTEM, TASK]
        session = LLMSession(client, tokenizer, SessionConfig(
            max_context_tokens=10_000, max_tokens=50, context_management="truncate"))
        await session.chat([SYSTEM, TASK])
        for i, message in enumerate(short):
            history += [{"role": "assistant", "content": texts[i]}, message]
            await session.chat([message])
        history.append({"role": "assistant", "content": texts[4]})
        # The limit that makes the long observation overflow at the next turn.
        limit = len(renderer.start([*history, observation])) - 1
        session.config = SessionConfig(max_context_tokens=limit, max_tokens=50,
                                       summarize_at=1.0, min_completion_tokens=1,
                                       context_management="truncate")
        reply = await session.chat([observation])
    assert reply.text == "after" and session.truncations == 1 and session.summaries == 0
    assert not any(b"Write a summary" in tokenizer.decode(p).encode() for p in server.prompts)
    exchanges = history[2:]
    fits = [i for i in range(len(exchanges)) if exchanges[i]["role"] == "assistant" and len(
        renderer.start([SYSTEM, TASK, *exchanges[i:], observation])) <= TRUNCATE_TO * limit]
    assert fits and fits[0] > 0  # something was dropped, something kept
    expected = renderer.start([SYSTEM, TASK, *exchanges[fits[0]:], observation])
    assert server.prompts[-1] == expected
    first, second = session.segments
    assert len(first.turns) == 5 and list(second.turns[0].prompt_ids) == expected


async def test_without_context_management_the_session_ends_when_a_reply_no_longer_fits(
        tokenizer):
    """Stops: `none` summarizing or truncating, or ending before the context is really full
    (it ignores summarize_at)."""
    config = dataclasses.replace(overflow_config(tokenizer), context_management="none",
                                 summarize_at=0.1)
    async with (ScriptedServer(tokenizer, replies(LONG_REPLY, summary=SUMMARY)) as server,
                InferenceClient([server.url]) as client):
        session = LLMSession(client, tokenizer, config)
        await session.chat([SYSTEM, TASK])  # far past summarize_at, yet it fits
        with pytest.raises(ContextOverflow, match="context management is off"):
            await session.chat([OBSERVATION])
    assert len(server.prompts) == 1 and session.summaries == session.truncations == 0


async def test_a_token_budget_stops_a_straggler_across_turns(tokenizer):
    """Stops: a trajectory sampling past agent.max_sampled_tokens (a straggler)."""
    config = SessionConfig(max_tokens=50, max_sampled_tokens=10)
    async with (ScriptedServer(tokenizer, replies("a b c d e f", "g h i j k l m n")) as server,
                InferenceClient([server.url]) as client):
        session = LLMSession(client, tokenizer, config)
        await session.chat(CONVERSATION[:2])
        first = session.sampled_tokens
        await session.chat([{"role": "user", "content": "more"}])
        assert server.max_tokens == [10, 10 - first]  # the second call gets what is left
        assert session.sampled_tokens == 10
        with pytest.raises(TokenBudgetSpent):
            await session.chat([{"role": "user", "content": "again"}])


def test_a_turn_stores_only_the_routing_its_segment_does_not_hold_yet():
    """R3 routing is O(tokens) per segment: a turn that extends the previous one keeps the rows
    from where that one's ended; a turn that does not extend it (or follows one without
    routing) keeps the completion's whole record."""
    import numpy as np

    from skyrl_agent.inference.client import Completion
    from skyrl_agent.llm.session import _new_routing
    from skyrl_agent.types import RoutedExperts, Turn

    def routed(start: int, rows: int) -> RoutedExperts:
        return RoutedExperts.from_array(np.arange(rows * 4).reshape(rows, 2, 2) % 7, start)

    def completion(rows: int | None) -> Completion:
        return Completion((9, 9), (-0.1, -0.2), (0, 0), "stop", "", "s",
                          routed_experts=None if rows is None else routed(0, rows))

    def turn(prompt: tuple[int, ...], routing: RoutedExperts | None) -> Turn:
        return Turn(prompt, (5, 6), (-0.1, -0.2), (1, 1), 0, FinishReason.STOP,
                    routed_experts=routing)

    first = turn((1, 2, 3), routed(0, 4))
    assert _new_routing([], [1, 2, 3], completion(4)) == routed(0, 4)
    extended = _new_routing([first], [1, 2, 3, 5, 6, 7], completion(7))
    assert extended is not None and (extended.start, extended.end) == (4, 7)
    assert (extended.array() == routed(0, 7).array()[4:]).all()
    assert _new_routing([first], [1, 2, 4, 5, 6, 7], completion(7)) == routed(0, 7)
    assert _new_routing([turn((1, 2, 3), None)], [1, 2, 3, 5, 6, 7], completion(7)) == \
        routed(0, 7)
    assert _new_routing([first], [1, 2, 3, 5, 6, 7], completion(None)) is None


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    """A tiny LLaVA's tokenizer and image inputs (built in about a second)."""
    from skyrl_agent.model.vision import ImageInputs
    from tests.tiny_models import char_vlm_dir

    folder = char_vlm_dir(tmp_path_factory.mktemp("vlm"))
    return AutoTokenizer.from_pretrained(folder), ImageInputs.for_model(folder)


def _shows(text: str, *pictures: bytes) -> dict:
    from skyrl_agent.llm.rendering import image_part

    return {"role": "user", "content": [{"type": "text", "text": text},
                                        *[image_part(p) for p in pictures]]}


def test_images_are_rendered_in_place_and_only_for_a_vision_model(vlm):
    """An image part becomes its span of image tokens where the template put it, in a fresh
    render and in one that extends a reply (offsets from the first new id); the text-only
    methods and a text model refuse image parts instead of dropping them; text-only messages
    pass through unchanged."""
    from skyrl_agent.llm.rendering import split_images
    from tests.tiny_models import png

    tokenizer, images = vlm
    red, blue = png((200, 0, 0)), png((0, 0, 200))
    renderer = ChatRenderer(tokenizer, images=images)
    start = renderer.render_start([_shows("see ", red)])
    [placed] = start.images
    assert placed.data == red and placed.length == 16
    assert start.ids[placed.offset : placed.end] == [images.token_id] * 16
    assert tokenizer.decode(start.ids[: placed.offset]).endswith("see ")
    reply = tokenizer.encode("red<|end|>", add_special_tokens=False)
    new = renderer.render_extend(reply, [_shows("and ", blue, red)])
    assert [i.data for i in new.images] == [blue, red]
    assert [new.ids[i.offset] for i in new.images] == [images.token_id] * 2
    whole = renderer.full([_shows("see ", red), {"role": "assistant", "content": "red"},
                           _shows("and ", blue, red)])
    assert [*start.ids, *reply, *new.ids][: len(whole)] == whole
    with pytest.raises(TemplateError, match="render_start"):
        renderer.start([_shows("see ", red)])
    with pytest.raises(TemplateError, match="not a vision model"):
        ChatRenderer(tokenizer).render_start([_shows("see ", red)])
    plain = [{"role": "user", "content": "hi"}]
    assert split_images(plain) == (plain, [])
    assert split_images([_shows("a", red)])[0] == [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"}]}]


async def test_a_session_keeps_every_images_span_across_turns_and_a_summary(vlm):
    """Each turn records every image its prompt shows, at its offset in that prompt; after a
    summary the new segment starts from the task (its picture too) plus the summary, then the
    pending observation with its own picture."""
    from skyrl_agent.agents.teacher import Teacher
    from tests.tiny_models import png

    tokenizer, images = vlm
    red, blue = png((200, 0, 0)), png((0, 0, 200))
    settings = SessionConfig(max_context_tokens=300, max_tokens=8, min_completion_tokens=8,
                             summary_prompt="Summarize.")
    teacher = Teacher(tokenizer, ["look", "more", "done"], summaries=["saw red"],
                      summary_request=settings.summary_prompt)
    session = LLMSession(teacher, tokenizer, settings, images=images)
    assert session.sees_images
    await session.chat([{"role": "system", "content": "S"}, _shows("task: ", red)])
    await session.chat([_shows("x" * 150, blue)])
    await session.chat([_shows("y" * 40, blue)])  # past 85% of 300 tokens: a summary first
    first, second = session.segments
    assert [[i.data for i in t.images] for t in first.turns] == [[red], [red, blue], [red, blue]]
    assert first.summary_turn_index == 2
    for turn in (*first.turns, *second.turns):
        for image in turn.images:
            assert turn.prompt_ids[image.offset : image.end] == (images.token_id,) * 16
    [restart] = second.turns
    assert [i.data for i in restart.images] == [red, blue]
    text = tokenizer.decode(list(restart.prompt_ids))
    assert "saw red" in text and text.index("task: ") < text.index("saw red")


async def test_complete_ids_records_each_call_in_the_segment_it_names(tokenizer):
    """The capture proxy's path (prompt ids rendered by the caller). Stops: a call recorded in
    another segment than the one named (or a new one not opened), max_tokens not cut to the
    session's max_tokens, the context and the token budget (a last token of room or budget is
    still usable), the stop strings dropped, a turn recorded otherwise than the server sent
    it, and such a segment counted as drift."""
    prompt = ChatRenderer(tokenizer).start(CONVERSATION[:2])
    limit = len(prompt) + 12
    # A: cut at max_tokens = 8; D: 2 tokens (1 + end of turn) of the 4 left of the budget;
    # B: 1 token of room; C: the budget's last token
    config = SessionConfig(max_context_tokens=limit, max_tokens=8, max_sampled_tokens=12)
    script = replies("a b c d e f g h i j", "m", "k l", "n o")
    async with (ScriptedServer(tokenizer, script) as server,
                InferenceClient([server.url]) as client):
        session = LLMSession(client, tokenizer, config)
        assert (await session.complete_ids(prompt, 100))[0] == 0  # A
        assert (await session.complete_ids(prompt, 100, stop=("END",)))[0] == 1  # D
        # B extends segment 0 (not the newest) up to one token short of the context
        longer = [*prompt, *session.segments[0].turns[0].completion_ids]
        longer += [longer[-1]] * (limit - 1 - len(longer))
        assert (await session.complete_ids(longer, 100, segment=0))[0] == 0
        assert (await session.complete_ids(prompt, 100))[0] == 2  # C
        with pytest.raises(ContextOverflow, match=f"has {limit} tokens; the context is {limit}"):
            await session.complete_ids([*longer, 0], 100, segment=0)
        with pytest.raises(TokenBudgetSpent, match="sampled 12 tokens, the budget is 12"):
            await session.complete_ids(prompt, 100)
    assert server.max_tokens == [8, 4, 1, 1]
    assert [b.get("stop") for b in server.bodies] == [None, ["END"], None, None]
    zero, one, two = session.segments
    assert [t.prompt_ids for t in zero.turns] == [tuple(prompt), tuple(longer)]
    assert [t.prompt_ids for t in (*one.turns, *two.turns)] == [tuple(prompt)] * 2
    a, b = zero.turns
    turns = [a, *one.turns, b, *two.turns]  # in the order of the calls
    assert [t.completion_ids for t in turns] == [tuple(ids) for ids in server.sampled_ids]
    assert [t.finish_reason for t in turns] == [FinishReason.LENGTH, FinishReason.STOP,
                                                FinishReason.LENGTH, FinishReason.LENGTH]
    for turn in turns:  # what the server sent: every token sampled, logprob -0.25, version 0
        n = len(turn.completion_ids)
        assert turn.loss_mask == (1,) * n and turn.completion_logprobs == (-0.25,) * n
        assert turn.policy_version == 0
    assert session.drift_tokens() == 0  # its caller measures drift, not the session


async def test_the_sampling_settings_reach_the_server(tokenizer):
    """Stops: a session's temperature, top_p or session id not sent (the server would sample
    with its defaults, or lose the session's KV-cache routing), and a seed that repeats or
    runs backwards across turns (each turn must sample anew, reproducibly)."""
    config = SessionConfig(max_tokens=20, temperature=0.7, top_p=0.9)
    before = time.time()
    async with (ScriptedServer(tokenizer, replies("a", "b", "c")) as server,
                InferenceClient([server.url]) as client):
        session = LLMSession(client, tokenizer, config, session_id="s-1", seed=41)
        for text in ("go", "on", "again"):
            await session.chat([*CONVERSATION[:1], {"role": "user", "content": text}]
                               if not session.num_turns else [{"role": "user", "content": text}])
    assert [b["seed"] for b in server.bodies] == [41, 42, 43]
    assert {(b["temperature"], b["top_p"]) for b in server.bodies} == {(0.7, 0.9)}
    assert server.session_ids == ["s-1"] * 3
    starts = [t.started_at for t in session.segments[0].turns]
    assert before <= starts[0] <= starts[1] <= starts[2] <= time.time()


async def test_model_time_adds_up_every_call(tokenizer):
    """Stops: model time that keeps only the last call's, or is not a duration at all."""
    async with (ScriptedServer(tokenizer, replies("first", "second")) as server,
                InferenceClient([server.url]) as client):
        session = LLMSession(client, tokenizer, SessionConfig(max_tokens=50))
        session.limiter = asyncio.Semaphore(1)
        started = time.monotonic()
        for messages in (CONVERSATION[:2], [{"role": "user", "content": "more"}]):
            await session.limiter.acquire()  # another session holds the slot for 0.2 s
            asyncio.get_running_loop().call_later(0.2, session.limiter.release)
            await session.chat(messages)
        wall = time.monotonic() - started
    assert 0.4 <= session.model_time_s <= wall


async def test_metrics_count_what_the_server_saw(tokenizer):
    """The names evaluation's statistics read, each counted independently from the server's
    own record of the prompts it got and the ids it sent."""
    async with (ScriptedServer(tokenizer, replies("first", "second")) as server,
                InferenceClient([server.url]) as client):
        session = LLMSession(client, tokenizer, SessionConfig(max_tokens=50))
        await session.chat(CONVERSATION[:2])
        await session.chat([{"role": "user", "content": "more"}])
    assert session.metrics() == {
        "turns": 2, "summaries": 0, "truncations": 0,
        "prompt_tokens": sum(map(len, server.prompts)),
        "completion_tokens": sum(map(len, server.sampled_ids)), "drift_tokens": 0}


def test_differing_tokens_counts_the_tokens_outside_the_common_subsequence():
    """Each case by hand: len(a) + len(b) - 2 * (tokens they share in order)."""
    assert differing_tokens([1, 2, 3], [1, 2, 3]) == 0
    assert differing_tokens([], [4, 5]) == 2 and differing_tokens([4, 5], []) == 2
    assert differing_tokens([1, 2], [1, 2, 3]) == 1  # one appended
    assert differing_tokens([0, 1, 2], [1, 2]) == 1  # one dropped at the head
    assert differing_tokens([1, 2, 3], [1, 9, 3]) == 2  # one replaced: 2 vs 9
    assert differing_tokens([9, 2, 3], [1, 2, 3]) == 2  # at the head
    assert differing_tokens([1, 2, 9], [1, 2, 3]) == 2  # at the tail
    # two edits apart: head [1], tail [6], middles [2 3 4 5] / [9 3 4 8] share 3 4
    assert differing_tokens([1, 2, 3, 4, 5, 6], [1, 9, 3, 4, 8, 6]) == 4
    # repeats: [7 7] vs [7 7 7] share two 7s; [7] vs [7 7 7 7] share one
    assert differing_tokens([7, 7], [7, 7, 7]) == 1
    assert differing_tokens([1, 7, 2], [1, 7, 7, 7, 2]) == 2
    # a long, repetitive history (past difflib's 200-item junk heuristic, where a token that
    # is over 1% of it would be ignored): the two edits, not the 300 shared tokens
    shared = [5, 6] * 150
    assert differing_tokens([1, *shared, 2], [3, *shared, 4]) == 4
    # every single edit of a sequence: an insertion or deletion of k tokens differs by k, a
    # replacement of k tokens by m new ones by k + m
    base = [1, 2, 3, 1, 2, 4]
    for start in range(len(base) + 1):
        for k in range(len(base) - start + 1):
            for m in range(3):
                edited = base[:start] + [50 + i for i in range(m)] + base[start + k:]
                assert differing_tokens(base, edited) == k + m, (start, k, m)
                assert differing_tokens(edited, base) == k + m, (start, k, m)
