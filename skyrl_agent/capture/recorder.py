"""One captured session: an external agent's chat requests mapped onto a token-exact LLMSession.

The agent sends whole conversations as text. The proxy never re-tokenizes what it returned:
each request is matched, message by message, against the conversations it has already served
(its branches). When the request repeats a branch up to one of its replies, the prompt is that
turn's prompt ids + the ids the model sampled + only the new messages rendered with the chat
template (rendering.py). When it continues the branch's last reply, the call joins that
branch's segment; any other request is a history rewrite (compaction, a summary, a sub-agent, a
retry) and opens a new segment, counted as a break, reusing an earlier turn's ids where the
request repeats it. Each call also measures what a re-tokenizing gateway would have trained on
instead: the whole conversation rendered from its text, against the ids recorded.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from skyrl_agent.capture import tools as tool_format
from skyrl_agent.capture.messages import Call, ChatMessage, ChatRequest, TextRequest, parse_messages
from skyrl_agent.inference.client import Completion, InferenceError
from skyrl_agent.llm.rendering import ChatRenderer
from skyrl_agent.llm.session import LLMSession, differing_tokens

Key = tuple[Any, ...]


@dataclass
class CaptureStats:
    """Counts of one captured session (they become trajectory metrics)."""

    calls: int = 0
    segment_breaks: int = 0
    """Calls that opened a new segment after the first (history rewrites)."""
    prefix_reused: int = 0
    """Of those, the ones that kept an earlier turn's ids as their prefix."""
    context_overflows: int = 0
    budget_spent: bool = False
    """A call was refused because the trajectory's max_sampled_tokens is spent."""

    def metrics(self) -> dict[str, float]:
        return {"capture_calls": self.calls, "segment_breaks": self.segment_breaks,
                "segment_prefix_reused": self.prefix_reused,
                "context_overflows": self.context_overflows}


@dataclass
class _Rerender:
    """A segment's recorded sequence beside a from-scratch rendering of its text, measured
    when asked (once per segment, not per call: it costs a full render and a diff)."""

    recorded: list[int]
    rerender: Callable[[], list[int]]
    _differing: int | None = None

    def differing(self) -> int:
        if self._differing is None:
            self._differing = differing_tokens(self.recorded, self.rerender())
        return self._differing


@dataclass(frozen=True)
class Captured:
    """One answered call."""

    completion: Completion
    prompt_ids: tuple[int, ...]
    content: str
    """The reply text the agent sees (before its tool calls, when it made any)."""
    tool_calls: tuple[Call, ...] = ()

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.tool_calls else self.completion.finish_reason


@dataclass
class _Mark:
    """One turn of a branch: how many messages came before its reply, and its ids."""

    boundary: int
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]


@dataclass
class _Branch:
    segment: int
    """Its segment's index in the LLM session."""
    tools: str
    """The tool definitions it was served with (canonical JSON; a change is a rewrite)."""
    keys: list[Key]
    """The conversation's messages, replies included."""
    marks: list[_Mark] = field(default_factory=list)
    measure: _Rerender | None = None


@dataclass(frozen=True)
class _Match:
    branch: _Branch
    mark: _Mark
    after_reply: bool
    """True: the request repeats the turn's reply too; False: it re-sends the turn's prompt."""
    covered: int
    """How many of the request's messages the reused ids stand for."""


class Templates:
    """Renderers of one tokenizer, per tool set (a template renders tools, or is told them)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.native_tools = tool_format.template_renders_tools(tokenizer)
        self._renderers: dict[str, ChatRenderer] = {}

    def renderer(self, tools: list[dict[str, Any]] | None, key: str) -> ChatRenderer:
        if key not in self._renderers:
            self._renderers[key] = ChatRenderer(self.tokenizer,
                                                tools if self.native_tools else None)
        return self._renderers[key]

    def form(self, messages: Sequence[ChatMessage],
             tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
        """Messages as the template gets them; tools it cannot render are described in the
        system message."""
        forms = [m.template_form(self.native_tools) for m in messages]
        if tools and not self.native_tools:
            description = tool_format.describe(tools)
            if forms and forms[0]["role"] == "system":
                forms[0] = {**forms[0], "content": f"{forms[0]['content']}\n\n{description}"}
            else:
                forms.insert(0, {"role": "system", "content": description})
        return forms


class CaptureSession:
    """An external agent's view of one LLMSession: OpenAI requests in, recorded turns out."""

    def __init__(self, llm: LLMSession, templates: Templates) -> None:
        self.llm = llm
        self.templates = templates
        self.stats = CaptureStats()
        self.lock = asyncio.Lock()
        """Calls of one session are answered one at a time, in arrival order."""
        self._branches: list[_Branch] = []
        self._raw: dict[Key, str] = {}
        """Each reply returned (as the agent will echo it) -> the text the model sampled."""
        self._text_branches: list[_TextBranch] = []
        self.server_error: InferenceError | None = None
        """The last model-server failure a call met (the agent saw a 502)."""

    # ---- chat -----------------------------------------------------------------------------

    async def chat(self, request: ChatRequest) -> Captured:
        messages = parse_messages(request.messages)
        keys = [m.key() for m in messages]
        tools_key = json.dumps(request.tools or [], sort_keys=True)
        renderer = self.templates.renderer(request.tools, tools_key)
        match = self._find(keys, tools_key)
        if match is None:
            forms = self.templates.form(self._as_sampled(messages), request.tools)
            prompt = renderer.start(forms)
        elif not match.after_reply:
            prompt = list(match.mark.prompt_ids)
        else:
            rest = self.templates.form(messages[match.covered:], None)
            prompt = [*match.mark.prompt_ids, *match.mark.completion_ids,
                      *renderer.extend(match.mark.completion_ids, rest)]
        joins = (match is not None and match.after_reply and match.mark is match.branch.marks[-1])
        segment = match.branch.segment if joins and match is not None else None
        index, completion = await self._sample(prompt, request.token_limit, segment,
                                               request.stop_strings)
        content: str = completion.text
        calls: tuple[Call, ...] = ()
        if request.wants_tools:
            content, calls = tool_format.split_reply(completion.text, request.tools or [])
        reply = ChatMessage("assistant", content, calls)
        self._raw[reply.key()] = completion.text
        branch = self._record(match, joins, index, keys, reply.key(), tools_key, prompt,
                              completion)
        forms = self.templates.form([*messages, reply], request.tools)
        branch.measure = _Rerender([*prompt, *completion.token_ids],
                                   lambda: renderer.full(forms))
        return Captured(completion, tuple(prompt), content, calls)

    def _find(self, keys: list[Key], tools: str) -> _Match | None:
        """The turn whose ids the request can reuse the most of."""
        best: _Match | None = None
        for branch in reversed(self._branches):
            if branch.tools != tools:
                continue
            common = _common_prefix(branch.keys, keys)
            for mark in reversed(branch.marks):
                if mark.boundary + 1 <= common and len(keys) > mark.boundary + 1:
                    found = _Match(branch, mark, True, mark.boundary + 1)
                elif mark.boundary == len(keys) <= common:
                    found = _Match(branch, mark, False, mark.boundary)
                else:
                    continue
                if best is None or found.covered > best.covered:
                    best = found
                break  # later turns of a branch cover more: the first hit is its best
        return best

    def _as_sampled(self, messages: Sequence[ChatMessage]) -> list[ChatMessage]:
        """Replies this session returned, put back as the text the model sampled (for a fresh
        rendering of a rewritten history: the nearest it can come to what the model saw)."""
        return [ChatMessage("assistant", self._raw[m.key()]) if m.key() in self._raw else m
                for m in messages]

    async def _sample(self, prompt: list[int], limit: int | None, segment: int | None,
                      stop: tuple[str, ...]) -> tuple[int, Completion]:
        from skyrl_agent.llm.session import ContextOverflow, TokenBudgetSpent

        self.stats.calls += 1
        try:
            return await self.llm.complete_ids(prompt, limit or self.llm.config.max_tokens,
                                               segment, stop)
        except ContextOverflow:
            self.stats.context_overflows += 1
            raise
        except TokenBudgetSpent:
            self.stats.budget_spent = True
            raise
        except InferenceError as exc:
            self.server_error = exc
            raise

    def _record(self, match: _Match | None, joins: bool, index: int, keys: list[Key], reply: Key,
                tools: str, prompt: list[int], completion: Completion) -> _Branch:
        mark = _Mark(len(keys), tuple(prompt), completion.token_ids)
        if joins and match is not None:
            match.branch.keys = [*keys, reply]
            match.branch.marks.append(mark)
            return match.branch
        if self._branches or self._text_branches:
            self.stats.segment_breaks += 1
            self.stats.prefix_reused += match is not None
        self._branches.append(_Branch(index, tools, [*keys, reply], [mark]))
        return self._branches[-1]

    def retokenization(self) -> tuple[int, int]:
        """What a re-tokenizing gateway would have trained on instead: over every segment's
        sequence as recorded, the tokens in which a from-scratch rendering of its text (the
        conversation through its last reply) differs, and how many segments differ at all."""
        measures = [b.measure for b in self._branches] + [b.measure for b in self._text_branches]
        differing = [m.differing() for m in measures if m is not None]
        return sum(differing), sum(d > 0 for d in differing)

    def metrics(self) -> dict[str, float]:
        tokens, segments = self.retokenization()
        return {**self.stats.metrics(), "retokenized_mismatch_tokens": tokens,
                "retokenized_mismatch_segments": segments}

    # ---- text completions -----------------------------------------------------------------

    async def complete_text(self, request: TextRequest) -> Captured:
        text = request.text
        found = _find_text(self._text_branches, text)
        encode = self.templates.tokenizer.encode
        if found is None:
            prompt = list(encode(text))
        else:
            _, turn, covered = found
            prompt = list(turn.prompt_ids)
            if covered > len(turn.prompt_text):
                prompt += [*turn.completion_ids,
                           *encode(text[covered:], add_special_tokens=False)]
        joins = found is not None and found[1] is found[0].turns[-1] and found[2] > len(
            found[1].prompt_text)
        segment = found[0].segment if joins and found is not None else None
        index, completion = await self._sample(prompt, request.max_tokens, segment,
                                               request.stop_strings)
        turn = _TextTurn(text, tuple(prompt), completion.text, completion.token_ids)
        if joins and found is not None:
            branch = found[0]
            branch.turns.append(turn)
        else:
            if self._branches or self._text_branches:
                self.stats.segment_breaks += 1
                self.stats.prefix_reused += found is not None
            branch = _TextBranch(index, [turn])
            self._text_branches.append(branch)
        full = text + completion.text
        branch.measure = _Rerender([*prompt, *completion.token_ids], lambda: list(encode(full)))
        return Captured(completion, tuple(prompt), completion.text)


@dataclass(frozen=True)
class _TextTurn:
    prompt_text: str
    prompt_ids: tuple[int, ...]
    completion_text: str
    completion_ids: tuple[int, ...]


@dataclass
class _TextBranch:
    segment: int
    turns: list[_TextTurn]
    measure: _Rerender | None = None


def _find_text(branches: list[_TextBranch],
               text: str) -> tuple[_TextBranch, _TextTurn, int] | None:
    """The turn whose ids a text prompt can reuse the most of, and how much text they cover."""
    best: tuple[_TextBranch, _TextTurn, int] | None = None
    for branch in reversed(branches):
        for turn in reversed(branch.turns):
            served = turn.prompt_text + turn.completion_text
            if len(text) > len(served) and text.startswith(served):
                covered = len(served)
            elif text == turn.prompt_text:
                covered = len(text)
            else:
                continue
            if best is None or covered > best[2]:
                best = (branch, turn, covered)
            break
    return best


def _common_prefix(a: Sequence[Key], b: Sequence[Key]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
