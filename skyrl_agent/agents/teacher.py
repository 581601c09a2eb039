"""A scripted teacher: the completion source of a demonstration.

It stands where a model server stands behind an LLMSession, so a demonstration is recorded by the
same session and agent code as any sampled trajectory. Each call returns the next scripted reply
as token ids: a reply given as text is tokenized canonically and closed with the end-of-turn
token (what a model that "meant" that text would sample); a reply given as ids (replaying a
stored trajectory) is returned unchanged. Like a model it obeys max_tokens: a longer reply is cut
and ends with finish reason `length`, and `truncated` counts it. A teacher given `summaries` also
answers the session's summary requests, with the summary written for the number of replies it
has given so far (a walkthrough's progress), without using a reply up.

Logprobs: the teacher is a deterministic policy, so every token it emits has probability 1 and
is recorded with logprob 0.0 and policy version 0. Supervised fine-tuning (cross-entropy) never
reads them; an off-policy RL loss would see them for what they are, tokens of another policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from skyrl_agent.inference.client import Completion, Sampling
from skyrl_agent.llm.session import TokenBudgetSpent
from skyrl_agent.types import PlacedImage

TEACHER_LOGPROB = 0.0
"""log(1): the teacher chose every token with certainty."""


class ScriptExhausted(TokenBudgetSpent):
    """The agent asked for more replies than the script holds: the teacher has no tokens left,
    so the agent stops the way a token budget stops it, and the episode is verified as it
    stands."""


class Teacher:
    """A CompletionClient that replies with a script, one reply per call."""

    def __init__(self, tokenizer: Any, replies: Sequence[str | Sequence[int]],
                 summaries: Sequence[str] = (), summary_request: str = "") -> None:
        self.tokenizer = tokenizer
        self._eos = tokenizer.eos_token_id
        self._replies = [self._ids(reply) for reply in replies]
        self._summaries = [self._ids(summary) for summary in summaries]
        """The summary to give after k replies, by k (the last one past the end)."""
        self._request = summary_request
        self._request_tokens = len(tokenizer.encode(summary_request, add_special_tokens=False))
        self.calls = 0
        """Replies given (summaries not counted)."""
        self.summaries = 0
        self.truncated = 0
        """Replies cut by max_tokens (the demonstration did not fit the agent's budget)."""

    def _ids(self, reply: str | Sequence[int]) -> tuple[int, ...]:
        if isinstance(reply, str):
            return (*self.tokenizer.encode(reply, add_special_tokens=False), self._eos)
        return tuple(int(i) for i in reply)

    async def complete(self, prompt_ids: Sequence[int], sampling: Sampling,
                       session_id: str | None = None,
                       images: tuple[PlacedImage, ...] = ()) -> Completion:
        if self._summaries and self._asks_for_summary(prompt_ids):
            ids = self._summaries[min(self.calls, len(self._summaries) - 1)]
            self.summaries += 1
        elif self.calls >= len(self._replies):
            raise ScriptExhausted(f"the script has {len(self._replies)} replies; the agent asked "
                                  "for another")
        else:
            ids = self._replies[self.calls]
            self.calls += 1
        if len(ids) > sampling.max_tokens:
            ids = ids[: sampling.max_tokens]
            self.truncated += 1
        finish = "stop" if ids and ids[-1] == self._eos else "length"
        return Completion(token_ids=ids, logprobs=(TEACHER_LOGPROB,) * len(ids),
                          token_policy_versions=(0,) * len(ids), finish_reason=finish,
                          text=self.tokenizer.decode(list(ids), skip_special_tokens=True),
                          server="teacher")

    def _asks_for_summary(self, prompt_ids: Sequence[int]) -> bool:
        """The prompt ends with the summary request (a few tokens of chat markup after it)."""
        tail = self.tokenizer.decode(list(prompt_ids[-(self._request_tokens + 16):]))
        return bool(self._request) and self._request in tail

    def end_session(self, session_id: str) -> None:
        """Nothing to forget: the teacher keeps no routes."""
