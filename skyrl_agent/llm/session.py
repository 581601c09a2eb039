"""LLMSession: the only way an agent calls the model, recorded token-exactly.

Within a segment, turn k+1's prompt is turn k's prompt + completion + the new messages rendered
alone (see rendering.py), so the ids trained on are the ids the model saw and sampled.

When the next prompt would pass the context budget the session makes room by its
`context_management`:
- `summarize` (at `summarize_at`): it asks the model to summarize progress (a recorded,
  trainable turn that closes the segment), then opens a new segment `[system, task + summary]`
  followed by the pending new messages, and the agent carries on;
- `truncate` (at `summarize_at`): it opens a new segment of the head (system + task), the newest
  exchanges that fit in half the context, and the pending messages: the oldest turns are dropped;
- `none`: nothing; the trajectory ends with a context overflow once a reply no longer fits.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from skyrl_agent.inference.client import Completion, CompletionClient, Sampling
from skyrl_agent.llm.rendering import ChatRenderer, Message
from skyrl_agent.model.vision import ImageInputs, Rendered
from skyrl_agent.types import FinishReason, RoutedExperts, Segment, Turn

SUMMARY_PROMPT = (
    "Your context is almost full. Write a summary of your progress for yourself: what the task "
    "is, what you did and found, what files you changed, what is still left to do, and the next "
    "step. Reply with the summary only; it will replace the conversation so far.")
SUMMARY_HEADER = "Summary of your earlier work on this task (your context was reset):"
ContextManagement = Literal["summarize", "truncate", "none"]
"""How a session makes room when the context fills (see the module docstring)."""
TRUNCATE_TO = 0.5
"""A truncated segment starts with at most this fraction of the context (so it is not cut
again at the very next turn)."""


class ContextOverflow(Exception):
    """The conversation does not fit the context window, even after summarizing."""


class TokenBudgetSpent(Exception):
    """The trajectory has sampled its `max_sampled_tokens`: a straggler stopped."""


@dataclass(frozen=True)
class SessionConfig:
    """Budgets and sampling of one session."""

    max_context_tokens: int = 8192
    """Prompt + completion never exceed this."""
    max_tokens: int = 1024
    """Most tokens per model call."""
    temperature: float = 1.0
    top_p: float = 1.0
    summarize_at: float = 0.85
    """Summarize when a prompt would pass this fraction of max_context_tokens."""
    min_completion_tokens: int = 64
    """Summarize when fewer tokens than this would be left for the reply."""
    summary_max_tokens: int = 512
    max_summaries: int = 4
    """Past this many summaries in one trajectory the session gives up (context overflow)."""
    summary_prompt: str = SUMMARY_PROMPT
    context_management: ContextManagement = "summarize"
    """How the session makes room when the context fills (see the module docstring)."""
    max_sampled_tokens: int | None = None
    """Most tokens the whole trajectory may sample, summaries included (a straggler deadline);
    each call's max_tokens is cut to what is left. None = no limit."""


@dataclass(frozen=True)
class Reply:
    """What the agent sees of one model call."""

    text: str
    finish_reason: FinishReason
    """stop (end of turn or stop string) or length (max_tokens)."""


@dataclass
class _Segment:
    messages: list[Message]
    turns: list[Turn] = field(default_factory=list)
    summary_turn_index: int | None = None


class LLMSession:
    """One agent's conversation with the model: token-exact turns, segments, summaries."""

    def __init__(self, client: CompletionClient, tokenizer: Any, config: SessionConfig,
                 tools: list[dict[str, Any]] | None = None, session_id: str | None = None,
                 seed: int | None = None, images: ImageInputs | None = None) -> None:
        """`images`: a vision model's image inputs (messages may then show images)."""
        self.client = client
        self.tokenizer = tokenizer
        self.config = config
        self.renderer = ChatRenderer(tokenizer, tools, images)
        self.session_id = session_id or uuid.uuid4().hex
        self.seed = seed
        self.summaries = 0
        self.truncations = 0
        self.model_time_s = 0.0
        """Seconds spent in model calls, a free slot under `limiter` waited for included."""
        self.limiter: asyncio.Semaphore | None = None
        """Set by a collector to bound model calls in flight across sessions."""
        self._head: list[Message] = []
        self._restart_head_len = 0
        """Messages at the start of the current segment that are its head (a restart's)."""
        self._segments: list[_Segment] = []

    # ---- the agent's API ----------------------------------------------------------------------

    async def chat(self, messages: Sequence[Message]) -> Reply:
        """Send new messages, get the model's reply. The first call's messages (system prompt +
        task) are the head that every summarized segment restarts from."""
        messages = list(messages)
        if not self._segments:
            self._head = messages
            self._restart_head_len = len(messages)
            self._segments.append(_Segment(messages=[]))
        prompt = self._next_prompt(messages)
        if self._needs_room(len(prompt.ids)):
            prompt = await self._make_room(messages)
        completion = await self._complete(prompt,
                                          self._budget(len(prompt.ids), self.config.max_tokens))
        self._current.messages += [*messages, _assistant(completion.text)]
        return Reply(completion.text, self._current.turns[-1].finish_reason)

    @property
    def sees_images(self) -> bool:
        """Whether the model is a vision model (messages may show it images)."""
        return self.renderer.images is not None

    @property
    def segments(self) -> tuple[Segment, ...]:
        return tuple(Segment(tuple(s.turns), s.summary_turn_index) for s in self._segments
                     if s.turns)

    @property
    def num_turns(self) -> int:
        return sum(len(s.turns) for s in self._segments)

    def metrics(self) -> dict[str, float]:
        turns = [t for s in self._segments for t in s.turns]
        return {"turns": len(turns), "summaries": self.summaries,
                "truncations": self.truncations,
                "prompt_tokens": sum(len(t.prompt_ids) for t in turns),
                "completion_tokens": sum(len(t.completion_ids) for t in turns),
                "drift_tokens": self.drift_tokens()}

    def drift_tokens(self) -> int:
        """Tokens that differ between the recorded ids and a from-scratch re-render of each
        segment's conversation (a measure of what re-tokenizing would have got wrong)."""
        drift = 0
        for segment in self._segments:
            if not segment.turns or not segment.messages:
                continue  # no turns, or recorded through complete_ids (its caller measures)
            last = segment.turns[-1]
            recorded = list(last.prompt_ids + last.completion_ids)
            rerendered = self.renderer.full(segment.messages)
            drift += differing_tokens(recorded, rerendered)
        return drift

    # ---- internals ----------------------------------------------------------------------------

    @property
    def _current(self) -> _Segment:
        return self._segments[-1]

    def _next_prompt(self, messages: list[Message]) -> Rendered:
        segment = self._current
        if not segment.turns:
            return self.renderer.render_start([*segment.messages, *messages])
        last = segment.turns[-1]
        new = self.renderer.render_extend(last.completion_ids, messages)
        history = len(last.prompt_ids) + len(last.completion_ids)
        return Rendered([*last.prompt_ids, *last.completion_ids, *new.ids],
                        last.images + tuple(i.shifted(history) for i in new.images))

    def _needs_room(self, prompt_len: int) -> bool:
        limit = self.config.max_context_tokens
        full = limit - prompt_len < self.config.min_completion_tokens
        if self.config.context_management == "none":
            return full
        return prompt_len > self.config.summarize_at * limit or full

    async def _make_room(self, pending: list[Message]) -> Rendered:
        if self.config.context_management == "summarize":
            return await self._summarize_and_restart(pending)
        if self.config.context_management == "truncate":
            return self._truncate_and_restart(pending)
        raise ContextOverflow(f"the context ({self.config.max_context_tokens} tokens) is full "
                              "and context management is off")

    def _truncate_and_restart(self, pending: list[Message]) -> Rendered:
        """A new segment: the head, the newest exchanges that fit in TRUNCATE_TO of the
        context, the pending messages. The oldest are dropped a reply at a time, with the
        messages that answered it (tool results, observations), so the segment goes on from a
        reply of the model's."""
        segment = self._current.messages
        head, kept = segment[: self._restart_head_len], segment[self._restart_head_len:]
        target = TRUNCATE_TO * self.config.max_context_tokens
        while kept and len(self.renderer.render_start([*head, *kept, *pending]).ids) > target:
            replies = [i for i, m in enumerate(kept) if i > 0 and m["role"] == "assistant"]
            kept = kept[replies[0]:] if replies else []
        prompt = self.renderer.render_start([*head, *kept, *pending])
        if self._needs_room(len(prompt.ids)):
            raise ContextOverflow(f"even the task and the newest messages need "
                                  f"{len(prompt.ids)} tokens of {self.config.max_context_tokens}")
        self.truncations += 1
        self._segments.append(_Segment(messages=[*head, *kept]))
        return prompt

    def _budget(self, prompt_len: int, wanted: int) -> int:
        room = self.config.max_context_tokens - prompt_len
        if room < 1:
            raise ContextOverflow(f"the prompt has {prompt_len} tokens; the context is "
                                  f"{self.config.max_context_tokens}")
        if self.config.max_sampled_tokens is not None:
            left = self.config.max_sampled_tokens - self.sampled_tokens
            if left < 1:
                raise TokenBudgetSpent(f"sampled {self.sampled_tokens} tokens, the budget is "
                                       f"{self.config.max_sampled_tokens}")
            room = min(room, left)
        return min(wanted, room)

    @property
    def sampled_tokens(self) -> int:
        return sum(len(t.completion_ids) for s in self._segments for t in s.turns)

    async def _summarize_and_restart(self, pending: list[Message]) -> Rendered:
        if self.summaries >= self.config.max_summaries or not self._current.turns:
            raise ContextOverflow("the conversation does not fit the context even after "
                                  f"{self.summaries} summaries")
        request = [{"role": "user", "content": self.config.summary_prompt}]
        prompt = self._next_prompt(request)
        completion = await self._complete(
            prompt, self._budget(len(prompt.ids), self.config.summary_max_tokens))
        self._current.messages += [*request, _assistant(completion.text)]
        self._current.summary_turn_index = len(self._current.turns) - 1
        self.summaries += 1
        system, *task = self._head
        summary = f"\n\n{SUMMARY_HEADER}\n{completion.text.strip()}"
        restarted = [system, *task[:-1], _appended(task[-1], summary)] if task else [system]
        self._segments.append(_Segment(messages=restarted))
        self._restart_head_len = len(restarted)
        prompt = self._next_prompt(pending)
        if self._needs_room(len(prompt.ids)):
            raise ContextOverflow(f"even a fresh segment with the summary needs "
                                  f"{len(prompt.ids)} tokens of {self.config.max_context_tokens}")
        return prompt

    async def complete_ids(self, prompt: Sequence[int], max_tokens: int,
                           segment: int | None = None,
                           stop: tuple[str, ...] = ()) -> tuple[int, Completion]:
        """One recorded call on prompt ids the caller rendered itself (the capture proxy, which
        decides from an external agent's requests which segment a call extends). The turn goes
        to segment `segment`, or opens a new one when None; returns the segment's index.
        `max_tokens` is cut to the context and token budgets, which raise as for `chat`. The
        caller vouches that the prompt extends the segment's last prompt + completion."""
        budget = self._budget(len(prompt), min(max_tokens, self.config.max_tokens))
        if segment is None:
            self._segments.append(_Segment(messages=[]))
            segment = len(self._segments) - 1
        completion = await self._complete(Rendered(list(prompt), ()), budget,
                                          self._segments[segment], stop)
        return segment, completion

    async def _complete(self, prompt: Rendered, max_tokens: int,
                        segment: _Segment | None = None,
                        stop: tuple[str, ...] = ()) -> Completion:
        started = time.time()
        seed = None if self.seed is None else self.seed + self.num_turns
        sampling = Sampling(max_tokens=max_tokens, temperature=self.config.temperature,
                            top_p=self.config.top_p, seed=seed, stop=stop)
        calling = time.monotonic()
        try:
            async with self.limiter or contextlib.nullcontext():
                completion = await self.client.complete(prompt.ids, sampling,
                                                        session_id=self.session_id,
                                                        images=prompt.images)
        finally:
            self.model_time_s += time.monotonic() - calling
        n = len(completion.token_ids)
        turns = (segment or self._current).turns
        turns.append(Turn(
            prompt_ids=tuple(prompt.ids), completion_ids=completion.token_ids,
            completion_logprobs=completion.logprobs, loss_mask=(1,) * n,
            policy_version=completion.policy_version,
            finish_reason=FinishReason.STOP if completion.finish_reason == "stop"
            else FinishReason.LENGTH,
            started_at=started, latency_s=completion.latency_s,
            token_policy_versions=completion.token_policy_versions,
            versions_exact=completion.versions_exact,
            routed_experts=_new_routing(turns, prompt.ids, completion), images=prompt.images))
        return completion

    def close(self) -> None:
        self.client.end_session(self.session_id)


def _new_routing(turns: list[Turn], prompt: list[int],
                 completion: Completion) -> RoutedExperts | None:
    """The completion's MoE routing from the first position the segment has none for yet: the
    rows earlier turns recorded are not stored twice (a segment's routing stays O(tokens))."""
    routing = completion.routed_experts
    if routing is None or not turns:
        return routing
    previous = turns[-1]
    history = previous.prompt_ids + previous.completion_ids
    if previous.routed_experts is None or tuple(prompt[: len(history)]) != history:
        return routing
    return routing.since(previous.routed_experts.end)


def differing_tokens(a: list[int], b: list[int]) -> int:
    """Tokens of either sequence outside their longest common subsequence blocks. The shared
    head and tail are skipped first, so the usual case (equal, or one local change) is linear."""
    head = 0
    while head < min(len(a), len(b)) and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < min(len(a), len(b)) - head and a[-1 - tail] == b[-1 - tail]:
        tail += 1
    middle_a, middle_b = a[head : len(a) - tail], b[head : len(b) - tail]
    if not middle_a or not middle_b:
        return len(middle_a) + len(middle_b)
    matcher = difflib.SequenceMatcher(None, middle_a, middle_b, autojunk=False)
    same = sum(block.size for block in matcher.get_matching_blocks())
    return len(middle_a) + len(middle_b) - 2 * same


def _appended(message: Message, text: str) -> Message:
    """`message` with `text` after its content (a text part, when it has parts: images)."""
    content = message["content"]
    if isinstance(content, list):
        return {**message, "content": [*content, {"type": "text", "text": text}]}
    return {**message, "content": f"{content}{text}"}


def _assistant(text: str) -> Message:
    return {"role": "assistant", "content": text}
