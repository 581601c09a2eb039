"""A scripted-reply model server for agent unit tests (the unit tier only).

It speaks the same /v1/completions contract as the real servers, with a real tokenizer: the reply
text is tokenized, an end-of-turn token appended, and every token gets a logprob. What it
replies comes from a script, so each agent path (success, malformed output, timeouts,
summarization) can be driven on purpose.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

Script = Callable[[str], str]
"""Decoded prompt -> reply text."""


def replies(*texts: str, summary: str = "Summary: keep going.") -> Script:
    """Reply with `texts` in order; a summary request gets `summary` without using one up."""
    queue = list(texts)

    def script(prompt: str) -> str:
        last_user = prompt.rsplit("<|im_start|>user", 1)[-1]
        if "Write a summary of your progress" in last_user:
            return summary
        if not queue:
            raise AssertionError("the agent asked for more replies than the script has")
        return queue.pop(0)

    return script


@dataclass
class ScriptedServer:
    tokenizer: Any
    script: Script
    prompts: list[list[int]] = field(default_factory=list)
    max_tokens: list[int] = field(default_factory=list)
    """The max_tokens of each request, in order."""
    sampled_ids: list[list[int]] = field(default_factory=list)
    """The ids each reply sent back, in order."""
    encode: Callable[[str], list[int]] | None = None
    """Reply text -> sampled ids; default the canonical tokenization. A test can return ids that
    decode to the text but are not its canonical encoding, as a real model may sample them."""
    url: str = ""
    bodies: list[dict[str, Any]] = field(default_factory=list)
    """Each request's JSON body, in order (its sampling settings)."""
    session_ids: list[str | None] = field(default_factory=list)
    """Each request's X-Session-ID header, in order."""

    async def completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        self.session_ids.append(request.headers.get("X-Session-ID"))
        prompt = body["prompt"]
        self.prompts.append(prompt)
        self.max_tokens.append(body["max_tokens"])
        text = self.script(self.tokenizer.decode(prompt))
        ids = (self.encode(text) if self.encode is not None
               else self.tokenizer.encode(text, add_special_tokens=False))
        finish = "stop"
        if len(ids) >= body["max_tokens"]:
            ids, finish = ids[: body["max_tokens"]], "length"
        else:
            ids.append(self.tokenizer.eos_token_id)
        self.sampled_ids.append(list(ids))
        choice = {"text": self.tokenizer.decode(ids, skip_special_tokens=True),
                  "token_ids": ids, "finish_reason": finish, "policy_version": 0,
                  "logprobs": {"token_logprobs": [-0.25] * len(ids)}}
        return web.json_response({"choices": [choice], "usage": {}})

    async def is_paused(self, request: web.Request) -> web.Response:
        return web.json_response({"is_paused": False})

    async def __aenter__(self) -> ScriptedServer:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/is_paused", self.is_paused)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._runner.cleanup()
