"""The capture proxy: an OpenAI-compatible HTTP server in front of LLM sessions.

An external agent gets a base URL (`http://127.0.0.1:PORT/s/KEY/v1`) or the key as its API key
(`Authorization: Bearer KEY` on `/v1/...`). Each key is one LLMSession: requests under it are
rendered, sent to the model server as token ids and recorded there (recorder.py); the agent
gets an ordinary chat completion (tool calls included) or text completion back.

Harbor's inference relay addresses many rollouts through one connector: its requests come to
`/r/rollout_id/R/request_id/Q/v1/...` under the connector's key (`open_rollouts`), and each new
rollout id R opens an LLMSession of its own, so one Harbor job's rollouts become separate
trajectories.

Everything a request carries is untrusted (it is agent code acting on model output): bodies are
size-bounded, an unknown or closed key gets a 401, a key reaches only its own session, and bad
input gets a 4xx in OpenAI's error shape while the proxy stays up.
"""

from __future__ import annotations

import logging
import re
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ValidationError

from skyrl_agent.capture import wire
from skyrl_agent.capture.messages import BadRequest, ChatRequest, TextRequest
from skyrl_agent.capture.recorder import Captured, CaptureSession, Templates
from skyrl_agent.inference.client import InferenceError
from skyrl_agent.llm.rendering import TemplateError
from skyrl_agent.llm.session import ContextOverflow, LLMSession, TokenBudgetSpent

log = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MAX_BODY_BYTES = 16 * 1024 * 1024
"""Largest request body accepted (long agent histories run to a few MB)."""


@dataclass(frozen=True)
class CaptureHandle:
    """What an external agent is given for one session, and the session it records into."""

    key: str
    """The session's secret: in the base URL, or as the API key."""
    base_url: str
    """OpenAI base URL with the key in its path (`.../s/KEY/v1`)."""
    session: CaptureSession


@dataclass
class RolloutSessions:
    """The sessions of Harbor rollouts relayed under one key: the first request that names a
    rollout id opens its session from `factory` (at most `limit` of them)."""

    key: str
    factory: Callable[[str], LLMSession]
    limit: int
    sessions: dict[str, CaptureSession] = field(default_factory=dict)
    """Per rollout id, its captured session."""
    requests: dict[str, list[str]] = field(default_factory=dict)
    """Per rollout id, the relay's request ids in the order they arrived."""


_CAPTURE_ID = re.compile(r"[A-Za-z0-9._:-]{1,200}")
"""What a rollout or request id in a capture path may be (Harbor's are UUIDs)."""


class _Refused(Exception):
    def __init__(self, status: int, message: str, kind: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.code = status, kind, code


class CaptureProxy:
    """One HTTP server on 127.0.0.1; sessions are opened and closed on it while it runs."""

    def __init__(self, model_name: str = "skyrl-agent", host: str = "127.0.0.1",
                 max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self.model_name = model_name
        self.host = host
        self.max_body_bytes = max_body_bytes
        self.url = ""
        self._sessions: dict[str, CaptureSession] = {}
        self._rollouts: dict[str, RolloutSessions] = {}
        self._templates: dict[int, Templates] = {}
        self._runner: web.AppRunner | None = None

    # ---- lifecycle --------------------------------------------------------------------------

    async def start(self, port: int = 0) -> str:
        app = web.Application(middlewares=[self._errors], client_max_size=self.max_body_bytes)
        relayed = "/r/rollout_id/{rollout}/request_id/{request}"
        # Relayed agents keep whatever base path they were configured with: `/v1` or none.
        for prefix in ("/s/{key}/v1", "/v1", f"{relayed}/v1", relayed):
            app.router.add_post(f"{prefix}/chat/completions", self._chat)
            app.router.add_post(f"{prefix}/responses", self._responses)
            app.router.add_post(f"{prefix}/messages", self._messages)
            app.router.add_post(f"{prefix}/completions", self._text)
            app.router.add_get(f"{prefix}/models", self._models)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, port).start()
        self.url = f"http://{self.host}:{self._runner.addresses[0][1]}"
        return self.url

    async def stop(self) -> None:
        self._sessions.clear()
        self._rollouts.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> CaptureProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def open(self, llm: LLMSession) -> CaptureHandle:
        """A new key for `llm`: what is sent under it is recorded there."""
        if not self.url:
            raise RuntimeError("start the capture proxy before opening sessions")
        key = secrets.token_urlsafe(24)
        session = self._capture(llm)
        self._sessions[key] = session
        return CaptureHandle(key, f"{self.url}/s/{key}/v1", session)

    def close(self, handle: CaptureHandle) -> None:
        """Refuse the key from now on (a call already running still finishes)."""
        self._sessions.pop(handle.key, None)

    def open_rollouts(self, factory: Callable[[str], LLMSession],
                      limit: int = 4096) -> RolloutSessions:
        """A key for a relay connector: `/r/rollout_id/R/...` requests under it are recorded
        in rollout R's own session, opened from `factory(R)` on its first request."""
        if not self.url:
            raise RuntimeError("start the capture proxy before opening sessions")
        rollouts = RolloutSessions(secrets.token_urlsafe(24), factory, limit)
        self._rollouts[rollouts.key] = rollouts
        return rollouts

    def close_rollouts(self, rollouts: RolloutSessions) -> None:
        self._rollouts.pop(rollouts.key, None)

    def _capture(self, llm: LLMSession) -> CaptureSession:
        templates = self._templates.get(id(llm.tokenizer))
        if templates is None or templates.tokenizer is not llm.tokenizer:
            templates = self._templates[id(llm.tokenizer)] = Templates(llm.tokenizer)
        return CaptureSession(llm, templates)

    # ---- routes -----------------------------------------------------------------------------

    async def _chat(self, request: web.Request) -> web.Response:
        session = self._session_of(request)
        body = await self._body(request, ChatRequest)
        async with session.lock:
            captured = await _answered(session, session.chat(body))
        return web.json_response(self._chat_json(body, captured, session))

    async def _responses(self, request: web.Request) -> web.Response:
        """OpenAI's Responses API (wire.py), answered like a chat call."""
        return await self._as_chat(request, wire.chat_from_responses, wire.responses_reply)

    async def _messages(self, request: web.Request) -> web.Response:
        """Anthropic's Messages API (wire.py), answered like a chat call."""
        return await self._as_chat(request, wire.chat_from_messages, wire.messages_reply)

    async def _as_chat(self, request: web.Request,
                       to_chat: Callable[[dict[str, Any]], ChatRequest],
                       reply: Callable[[Captured, str], dict[str, Any]]) -> web.Response:
        session = self._session_of(request)
        body = to_chat(await self._json(request))
        async with session.lock:
            captured = await _answered(session, session.chat(body))
        return web.json_response(reply(captured, body.model or self.model_name))

    async def _text(self, request: web.Request) -> web.Response:
        session = self._session_of(request)
        body = await self._body(request, TextRequest)
        async with session.lock:
            captured = await _answered(session, session.complete_text(body))
        completion = captured.completion
        choice: dict[str, Any] = {"index": 0, "text": captured.content,
                                  "finish_reason": captured.finish_reason, "logprobs": None}
        if body.logprobs is not None:
            tokens = [session.templates.tokenizer.decode([i]) for i in completion.token_ids]
            choice["logprobs"] = {"tokens": tokens, "token_logprobs": list(completion.logprobs),
                                  "top_logprobs": None, "text_offset": None}
        if body.return_token_ids:
            choice |= {"prompt_token_ids": list(captured.prompt_ids),
                       "token_ids": list(completion.token_ids)}
        return web.json_response({
            "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
            "created": int(time.time()), "model": body.model or self.model_name,
            "choices": [choice], "usage": _usage(captured)})

    async def _models(self, request: web.Request) -> web.Response:
        session = self._session_of(request)
        card = {"id": self.model_name, "object": "model", "owned_by": "skyrl-agent",
                "max_model_len": session.llm.config.max_context_tokens}
        return web.json_response({"object": "list", "data": [card]})

    def _chat_json(self, body: ChatRequest, captured: Captured,
                   session: CaptureSession) -> dict[str, Any]:
        completion = captured.completion
        message: dict[str, Any] = {"role": "assistant",
                                   "content": captured.content or (
                                       None if captured.tool_calls else "")}
        if captured.tool_calls:
            message["tool_calls"] = [c.openai() for c in captured.tool_calls]
        choice: dict[str, Any] = {"index": 0, "message": message,
                                  "finish_reason": captured.finish_reason, "logprobs": None}
        if body.logprobs:
            decode = session.templates.tokenizer.decode
            choice["logprobs"] = {"content": [
                {"token": decode([i]), "logprob": lp, "bytes": list(decode([i]).encode()),
                 "top_logprobs": []}
                for i, lp in zip(completion.token_ids, completion.logprobs, strict=True)]}
        reply: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
            "created": int(time.time()), "model": body.model or self.model_name,
            "choices": [choice], "usage": _usage(captured)}
        if body.return_token_ids:
            reply["prompt_token_ids"] = list(captured.prompt_ids)
            choice["token_ids"] = list(completion.token_ids)
        return reply

    # ---- input ------------------------------------------------------------------------------

    def _session_of(self, request: web.Request) -> CaptureSession:
        key = request.match_info.get("key")
        if key is None:
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            key = token.strip() if scheme.lower() == "bearer" else ""
        if "rollout" in request.match_info:
            return self._rollout_session(request, key)
        session = self._sessions.get(key) if key and len(key) <= 128 else None
        if session is None:
            raise _Refused(401, "unknown or closed capture session key", "authentication_error",
                           "invalid_api_key")
        return session

    def _rollout_session(self, request: web.Request, key: str) -> CaptureSession:
        """Rollout R's session under a relay key, opened on R's first request."""
        rollouts = self._rollouts.get(key) if key and len(key) <= 128 else None
        if rollouts is None:
            raise _Refused(401, "unknown or closed relay key", "authentication_error",
                           "invalid_api_key")
        rollout, request_id = request.match_info["rollout"], request.match_info["request"]
        if not (_CAPTURE_ID.fullmatch(rollout) and _CAPTURE_ID.fullmatch(request_id)):
            raise BadRequest("rollout and request ids are 1-200 letters, digits or ._:-")
        session = rollouts.sessions.get(rollout)
        if session is None:
            if len(rollouts.sessions) >= rollouts.limit:
                raise _Refused(429, f"more than {rollouts.limit} rollouts under this key",
                               "rate_limit_error")
            session = rollouts.sessions[rollout] = self._capture(rollouts.factory(rollout))
            rollouts.requests[rollout] = []
        rollouts.requests[rollout].append(request_id)
        return session

    async def _body[M: BaseModel](self, request: web.Request, model: type[M]) -> M:
        return model.model_validate(await self._json(request))

    async def _json(self, request: web.Request) -> dict[str, Any]:
        try:
            data = await request.json()
        except ValueError as exc:  # JSON and Unicode errors both
            raise BadRequest(f"invalid JSON body: {exc}") from None
        if not isinstance(data, dict):
            raise BadRequest("the JSON body must be an object")
        return data

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except _Refused as exc:
            refused = exc
        except (BadRequest, TemplateError) as exc:
            refused = _Refused(400, str(exc), "invalid_request_error")
        except ValidationError as exc:
            refused = _Refused(400, _validation_message(exc), "invalid_request_error")
        except InferenceError as exc:
            refused = _Refused(502, f"model server: {exc.message}", "api_error")
        except web.HTTPException as exc:  # 404, 405, 413 from aiohttp itself
            refused = _Refused(exc.status, exc.reason, "invalid_request_error")
        if request.path.endswith("/messages"):  # Anthropic's clients read their own shape
            return web.json_response(wire.anthropic_error(refused.status, str(refused)),
                                     status=refused.status)
        return _error(refused.status, str(refused), refused.kind, refused.code)


async def _answered(session: CaptureSession, call: Awaitable[Captured]) -> Captured:
    """The call's result; budget refusals as OpenAI errors."""
    try:
        return await call
    except ContextOverflow as exc:
        # OpenAI's own wording: client libraries map it to their context-window error, which is
        # what makes agents compact their history.
        limit = session.llm.config.max_context_tokens
        raise _Refused(400, f"This model's maximum context length is {limit} tokens ({exc}). "
                            "Please reduce the length of the messages.",
                       "invalid_request_error", "context_length_exceeded") from None
    except TokenBudgetSpent as exc:
        raise _Refused(400, f"the trajectory's token budget is spent: {exc}",
                       "invalid_request_error", "token_budget_spent") from None


def _usage(captured: Captured) -> dict[str, int]:
    prompt, completion = len(captured.prompt_ids), len(captured.completion.token_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def _error(status: int, message: str, kind: str, code: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": code or status}}
    return web.json_response(body, status=status)


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"])
        message = err["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts)
