"""HTTP routes of the embedded server (aiohttp), shaped like vLLM's OpenAI-compatible server.

Bad input gets a 4xx with an OpenAI-style `{"error": {...}}` body; the server stays up.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError

from skyrl_agent.inference.auth import key_matches, presented_key, unauthorized
from skyrl_agent.inference.server import render
from skyrl_agent.inference.server.engine import Engine
from skyrl_agent.inference.server.kv_budget import KVBudgetExceeded
from skyrl_agent.inference.server.metrics import ServerMetrics
from skyrl_agent.inference.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    ImageChunk,
    RequestLimits,
    TokenChunk,
    TokenizeRequest,
    UpdateWeightsRequest,
)
from skyrl_agent.inference.server.render import BadRequest
from skyrl_agent.model.vision import (
    ImageError,
    Rendered,
    check_image_count,
    image_bytes,
    split_image_parts,
)
from skyrl_agent.model.weights.folders import WeightUpdateError
from skyrl_agent.types import ChangedWeights

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PAUSE_MODES = ("keep", "wait", "abort")
DEFAULT_LIMITS = RequestLimits()
OPEN_ROUTES = frozenset({"/health"})
CONTROL_ROUTES = frozenset({"/pause", "/resume", "/update_weights"})
"""Routes that change what every client gets: never open to whoever reaches the port."""


def _error(status: int, message: str, kind: str = "BadRequestError") -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return web.json_response(body, status=status)


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            parts.append(f"unknown field {where!r}")
        else:
            parts.append(f"{where}: {err['msg'].removeprefix('Value error, ')}" if where
                         else err["msg"])
    return "; ".join(parts)


class EmbeddedServer:
    """Routes over one engine, one tokenizer and one served model name.

    `api_key` protects every route but /health (vLLM's --api-key). `control_key` (the run that
    started the server made it) protects the control routes only. With neither, the control
    routes are off and generation is open.
    """

    def __init__(self, engine: Engine, tokenizer: Any, served_model_name: str, *,
                 api_key: str | None = None, control_key: str | None = None,
                 limits: RequestLimits = DEFAULT_LIMITS) -> None:
        self.engine = engine
        self.api_key = api_key
        self.control_key = control_key
        self.limits = limits
        self.tokenizer = tokenizer
        self.model_name = served_model_name
        self.metrics = ServerMetrics(engine)
        self.vocab_size = len(tokenizer)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._errors, self._authenticate],
                              client_max_size=64 * 1024 * 1024)
        app.add_routes([
            web.get("/health", self.health), web.get("/v1/models", self.models),
            web.post("/v1/completions", self.completions),
            web.post("/v1/chat/completions", self.chat_completions),
            web.post("/tokenize", self.tokenize), web.post("/detokenize", self.detokenize),
            web.post("/pause", self.pause), web.post("/resume", self.resume),
            web.get("/is_paused", self.is_paused), web.post("/update_weights", self.update_weights),
            web.get("/metrics", self.metrics_text),
        ])
        return app

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        route = request.match_info.route.resource
        route_name = route.canonical if route is not None else "unmatched"
        try:
            response = await handler(request)
        except (BadRequest, ImageError, WeightUpdateError, KVBudgetExceeded) as exc:
            response = _error(400, str(exc))
        except ValidationError as exc:
            response = _error(400, _validation_message(exc))
        except web.HTTPException as exc:
            response = _error(exc.status, exc.reason, type(exc).__name__)
        except RuntimeError as exc:  # a failed engine step
            response = _error(500, str(exc), "InternalServerError")
        self.metrics.http_responses.labels(route_name, str(response.status)).inc()
        return response

    @web.middleware
    async def _authenticate(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        # By the route that will answer, not the request's spelling of the path.
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else None
        if route in OPEN_ROUTES:
            return await handler(request)
        keys = [self.api_key] if self.api_key else []
        if route in CONTROL_ROUTES:
            keys += [self.control_key] if self.control_key else []
            if not keys:
                return unauthorized("control routes are off: start the server with --api-key "
                                    "(or SKYRL_AGENT_API_KEY) to use them")
        elif not keys:
            return await handler(request)  # no --api-key: generation is open
        presented = presented_key(request.headers)
        if not any(key_matches(presented, key) for key in keys):
            return unauthorized("a valid API key is required (Authorization: Bearer KEY)")
        return await handler(request)

    async def _body[M: BaseModel](self, request: web.Request, model: type[M]) -> M:
        try:
            data = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BadRequest(f"invalid JSON body: {exc}") from None
        if not isinstance(data, dict):
            raise BadRequest("the JSON body must be an object")
        body = model.model_validate(data)
        name = getattr(body, "model", None)
        if name is not None and name != self.model_name:
            raise web.HTTPNotFound(reason=f"model {name!r} does not exist; "
                                          f"this server serves {self.model_name!r}")
        return body

    def _encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        render.check_text_size(text, self.limits.max_prompt_chars)
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def _check_sequences(self, prompts: int, n: int) -> None:
        if prompts * n > self.limits.max_sequences:
            raise BadRequest(f"{prompts} prompts x n={n} is {prompts * n} sequences; this server "
                             f"takes at most {self.limits.max_sequences} per request")

    def _check_prompt(self, ids: list[int], max_tokens: int | None) -> int:
        """Validate a prompt against the vocabulary and context; returns the token budget."""
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise BadRequest(f"token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})")
        limit = self.engine.max_model_len
        if len(ids) >= limit:
            raise BadRequest(f"the prompt has {len(ids)} tokens but the model's context is "
                             f"{limit} tokens")
        if max_tokens is None:
            return limit - len(ids)
        if len(ids) + max_tokens > limit:
            raise BadRequest(f"the model's context is {limit} tokens, but {len(ids)} prompt "
                             f"tokens + max_tokens {max_tokens} exceed it")
        return max_tokens

    # ---- generation ------------------------------------------------------------------------

    async def completions(self, request: web.Request) -> web.Response:
        body = await self._body(request, CompletionRequest)
        self._check_sequences(1 if body.prompt is None else len(body.prompts()), body.n)
        if body.return_routed_experts and not self.engine.moe_layers:
            raise BadRequest("return_routed_experts needs a mixture-of-experts model; "
                             f"{self.model_name} has no MoE router layers")
        if body.prompt_chunks is not None:
            rendered = self._chunks(body.prompt_chunks)
            prompts, images = [rendered.ids], [rendered.images]
        else:
            prompts = [p if isinstance(p, list) else self._encode(p) for p in body.prompts()]
            images = [self._no_images(p) for p in prompts]
        budgets = [self._check_prompt(p, body.max_tokens) for p in prompts]
        results = await asyncio.gather(*[
            self.engine.generate(p, body.sampling(b, body.logprobs), body.n, i)
            for p, b, i in zip(prompts, budgets, images, strict=True)])
        return web.json_response(render.completion_response(
            self.model_name, self.tokenizer, prompts, list(results), body.return_token_ids,
            body.logprobs is not None, self.engine.policy_version, body.return_routed_experts))

    async def chat_completions(self, request: web.Request) -> web.Response:
        body = await self._body(request, ChatCompletionRequest)
        self._check_sequences(1, body.n)
        messages, pictures = split_image_parts(body.messages)
        if pictures and self.engine.images is None:
            raise BadRequest(f"{self.model_name} is not a vision model; it takes no images")
        if self.engine.images is not None and pictures:
            text = render.chat_text(self.engine.images.processor, messages, body.tools,
                                    body.add_generation_prompt, body.continue_final_message,
                                    body.chat_template_kwargs, self.limits.max_prompt_chars)
            prompt = self.engine.images.render_text(text, pictures)
        else:
            ids = render.chat_prompt_ids(self.tokenizer, messages, body.tools,
                                         body.add_generation_prompt, body.continue_final_message,
                                         body.chat_template_kwargs, self.limits.max_prompt_chars)
            prompt = Rendered(ids, self._no_images(ids))
        budget = self._check_prompt(prompt.ids, body.token_limit)
        outputs = await self.engine.generate(prompt.ids,
                                             body.sampling(budget, body.logprob_count), body.n,
                                             prompt.images)
        return web.json_response(render.chat_response(
            self.model_name, self.tokenizer, prompt.ids, outputs, body.return_token_ids,
            body.logprobs, self.engine.policy_version))

    def _chunks(self, chunks: list[TokenChunk | ImageChunk]) -> Rendered:
        """A prompt given as token and image chunks, with each image's span in place."""
        vision = self.engine.images
        if vision is None:
            raise BadRequest(f"{self.model_name} is not a vision model; use prompt")
        check_image_count(sum(1 for chunk in chunks if isinstance(chunk, ImageChunk)))
        parts: list[list[int] | bytes] = []
        for chunk in chunks:
            if isinstance(chunk, TokenChunk):
                parts.append(chunk.tokens)
                continue
            data = image_bytes(chunk.data)
            vision.check_expected(data, chunk.expected_tokens)
            parts.append(data)
        return vision.expand(parts)

    def _no_images(self, ids: list[int]) -> tuple[()]:
        """A prompt without images may not hold the image token: it would stand for nothing."""
        if self.engine.images is not None:
            self.engine.images.check_placement(ids, ())
        return ()

    # ---- tokens ------------------------------------------------------------------------------

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await self._body(request, TokenizeRequest)
        if body.messages is not None:
            ids = render.chat_prompt_ids(self.tokenizer, body.messages, body.tools,
                                         body.add_generation_prompt,
                                         template_kwargs=body.chat_template_kwargs,
                                         max_chars=self.limits.max_prompt_chars)
        else:
            assert body.prompt is not None  # the request checks that one of them is given
            ids = self._encode(body.prompt, body.add_special_tokens)
        return web.json_response({"tokens": ids, "count": len(ids),
                                  "max_model_len": self.engine.max_model_len})

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await self._body(request, DetokenizeRequest)
        self._check_prompt(body.tokens, 0)
        return web.json_response({"prompt": self.tokenizer.decode(body.tokens)})

    # ---- control ------------------------------------------------------------------------------

    async def pause(self, request: web.Request) -> web.Response:
        mode = request.query.get("mode", "keep")
        if mode not in PAUSE_MODES:
            raise BadRequest(f"mode must be one of {', '.join(PAUSE_MODES)}, not {mode!r}")
        await self.engine.pause(mode)  # type: ignore[arg-type]
        return web.json_response({"is_paused": True, "mode": mode})

    async def resume(self, request: web.Request) -> web.Response:
        await self.engine.resume()
        return web.json_response({"is_paused": False})

    async def is_paused(self, request: web.Request) -> web.Response:
        return web.json_response({"is_paused": self.engine.is_paused})

    async def update_weights(self, request: web.Request) -> web.Response:
        body = await self._body(request, UpdateWeightsRequest)
        changed = None if body.changed is None else ChangedWeights(
            body.changed.since_version,
            {k: None if v is None else tuple(v) for k, v in body.changed.rows.items()})
        times = await self.engine.update_weights(body.path, body.version, changed)
        return web.json_response({"policy_version": body.version,
                                  "seconds": times.transfer_s + times.pause_s,
                                  "pause_seconds": times.pause_s})

    # ---- status --------------------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:
        card = {"id": self.model_name, "object": "model", "owned_by": "skyrl-agent",
                "max_model_len": self.engine.max_model_len,
                "weight_swap": "live",  # update_weights needs no pause: see weight_swap.py
                "policy_version": self.engine.policy_version}
        return web.json_response({"object": "list", "data": [card]})

    async def metrics_text(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})
