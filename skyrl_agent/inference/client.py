"""The token-in/token-out client: the only way the rest of the project reaches a model server.

- Prompts go out as token ids; the sampled ids and their logprobs come back unchanged, so what
  the trainer sees is exactly what the model sampled.
- Several servers: a session id sticks to one server (its prefix cache stays warm); a new
  session goes to the server with the fewest requests in flight.
- Connection errors and 502/503/504 are retried with exponential backoff (tenacity).
- A request ended by `pause(mode=abort)` is continued after resume from its partial output, so
  callers never see the pause; requests sent during a `keep` pause simply wait on the server.
- Control calls (pause, resume, update_weights) go to every server.
- Each server may have its own key, sent as `Authorization: Bearer KEY` on every call.
- A server is reached at `http://HOST:PORT` or on a Unix socket, `unix:PATH`.
- vLLM (its model card says `owned_by: vllm`) is spoken to on its own routes
  (inference/vllm/routes.py): generation with per-token weight versions, native weight updates.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_exponential

from skyrl_agent.inference.process import unix_socket_of
from skyrl_agent.inference.request_body import PromptIds, completion_body, ids_text
from skyrl_agent.inference.vllm import routes as vllm_routes
from skyrl_agent.model.weights.transport import WeightUpdate
from skyrl_agent.types import ChangedWeights, PlacedImage, RoutedExperts

REMEMBERED_PROMPTS = 4096
"""Sessions whose last prompt the client keeps as JSON (the oldest is dropped beyond)."""


class InferenceError(Exception):
    """The server refused a request (4xx), failed it (5xx), or never answered (status 0)."""

    def __init__(self, status: int, message: str, url: str) -> None:
        super().__init__(f"{url}: HTTP {status}: {message}")
        self.status = status
        self.message = message


class _Retryable(Exception):
    """A transient server answer (502/503/504) worth retrying."""


@dataclass(frozen=True)
class Sampling:
    """Per-call sampling settings."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    """Generate past end-of-sequence (benchmarks; vLLM's extension)."""


@dataclass(frozen=True)
class Completion:
    """What one model call produced, token-exactly."""

    token_ids: tuple[int, ...]
    """The sampled ids, in order (including an end-of-turn token when the model emitted one)."""
    logprobs: tuple[float, ...]
    """Logprob of each sampled id under the sampling weights."""
    token_policy_versions: tuple[int, ...]
    """Per token, the weight version that sampled it."""
    finish_reason: str
    """stop or length (an abort is continued transparently, so never abort)."""
    text: str
    """The decoded text (cut before a stop string)."""
    server: str
    """Base URL of the server that answered."""
    cached_prompt_tokens: int = 0
    """Prompt tokens served from the server's prefix cache."""
    latency_s: float = 0.0
    routed_experts: RoutedExperts | None = None
    """MoE models, when the client asks for routing: the experts chosen at every position the
    model ran on (the prompt, then each sampled token but the last)."""
    versions_exact: bool = False
    """Each token was sampled by its version's weights alone (see Turn.versions_exact)."""

    @property
    def policy_version(self) -> int:
        """The oldest version among the tokens (what a staleness bound must look at)."""
        return min(self.token_policy_versions, default=0)


def prompt_chunks(prompt: Sequence[int],
                  images: tuple[PlacedImage, ...]) -> list[dict[str, Any]]:
    """A prompt with images as the server's token and image chunks: each image's span of
    image tokens is sent as the image itself (base64), with the span's length for the server
    to check against its own processor."""
    chunks: list[dict[str, Any]] = []
    at = 0
    for image in images:
        if image.offset > at:
            chunks.append({"type": "encoded_text", "tokens": list(prompt[at : image.offset])})
        chunks.append({"type": "image", "data": base64.b64encode(image.data).decode(),
                       "expected_tokens": image.length})
        at = image.end
    if at < len(prompt):
        chunks.append({"type": "encoded_text", "tokens": list(prompt[at:])})
    return chunks


class CompletionClient(Protocol):
    """What an LLM session needs from a model: token-exact completions of token-id prompts.
    InferenceClient is the one over HTTP servers; a scripted teacher (demonstrations) is
    another."""

    async def complete(self, prompt_ids: Sequence[int], sampling: Sampling,
                       session_id: str | None = None,
                       images: tuple[PlacedImage, ...] = ()) -> Completion: ...

    def end_session(self, session_id: str) -> None: ...


@dataclass
class _Server:
    url: str
    api_key: str | None = field(default=None, repr=False)
    in_flight: int = 0
    policy_version: int = 0
    sessions: set[str] = field(default_factory=set)
    card: dict[str, Any] | None = None
    """Its first model card (None until asked): whether it is vLLM, whether it stages weight
    updates beside decoding and swaps them in between two steps."""
    http: aiohttp.ClientSession | None = field(default=None, repr=False)
    adapter: str | None = None
    """vLLM: the LoRA adapter requests name as their model, once the trainer's is loaded."""
    takes_adapters: bool | None = None
    """vLLM: whether it has runtime LoRA (None until an update with an adapter asked)."""

    @property
    def base(self) -> str:
        """What request paths are appended to (a Unix socket's server is `localhost`)."""
        return "http://localhost" if unix_socket_of(self.url) else self.url

    @property
    def is_vllm(self) -> bool:
        return (self.card or {}).get("owned_by") == vllm_routes.OWNER


class InferenceClient:
    """Async client over one or more OpenAI/vLLM-compatible servers."""

    def __init__(self, urls: Sequence[str], model: str | None = None, *,
                 api_keys: Sequence[str | None] | None = None,
                 request_timeout_s: float = 900.0, retry_deadline_s: float = 120.0,
                 pause_poll_s: float = 0.2, routed_experts: bool = False) -> None:
        if not urls:
            raise ValueError("InferenceClient needs at least one server URL")
        keys = list(api_keys) if api_keys is not None else [None] * len(urls)
        if len(keys) != len(urls):
            raise ValueError("InferenceClient needs one API key (or None) per server URL")
        self.servers = [_Server(u.rstrip("/").removesuffix("/v1"), k)
                        for u, k in zip(urls, keys, strict=True)]
        self.model = model
        self.request_timeout_s = request_timeout_s
        self.retry_deadline_s = retry_deadline_s
        self.pause_poll_s = pause_poll_s
        self.routed_experts = routed_experts
        """Ask the servers for each call's MoE routing (Rollout Routing Replay)."""
        self._routes: dict[str, _Server] = {}
        self._prompts: dict[str, PromptIds] = {}
        """Per live session, the JSON of its last prompt (only new ids are encoded)."""
        self._busy_s = 0.0
        self._busy_since: float | None = None

    async def __aenter__(self) -> InferenceClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for server in self.servers:
            if server.http is not None:
                await server.http.close()
                server.http = None

    def _http(self, server: _Server) -> aiohttp.ClientSession:
        if server.http is None:
            timeout = aiohttp.ClientTimeout(total=self.request_timeout_s)
            socket_path = unix_socket_of(server.url)
            # No connection limit: the collector bounds concurrency itself.
            connector = (aiohttp.UnixConnector(socket_path, limit=0) if socket_path
                         else aiohttp.TCPConnector(limit=0))
            server.http = aiohttp.ClientSession(timeout=timeout, connector=connector)
        return server.http

    # ---- routing --------------------------------------------------------------------------

    def route(self, session_id: str | None) -> _Server:
        """The sticky server of a session; new sessions go to the least busy server."""
        if session_id is not None and session_id in self._routes:
            return self._routes[session_id]
        server = min(self.servers, key=lambda s: (s.in_flight, len(s.sessions)))
        if session_id is not None:
            self._routes[session_id] = server
            server.sessions.add(session_id)
        return server

    def end_session(self, session_id: str) -> None:
        """Forget a finished session's route."""
        self._prompts.pop(session_id, None)
        server = self._routes.pop(session_id, None)
        if server is not None:
            server.sessions.discard(session_id)

    # ---- generation -----------------------------------------------------------------------

    async def complete(self, prompt_ids: Sequence[int], sampling: Sampling,
                       session_id: str | None = None,
                       images: tuple[PlacedImage, ...] = ()) -> Completion:
        """Sample one completion of `prompt_ids` (token ids in, ids + logprobs out); a vision
        model's prompt carries `images` over their spans of image tokens."""
        server = self.route(session_id)
        started = time.monotonic()
        ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        texts: list[str] = []
        exact = True
        self._count_in(server)
        try:
            while True:
                budget = sampling.max_tokens - len(ids)
                choice, cached = await self._complete_once(
                    server, [*prompt_ids, *ids], sampling, budget, session_id, images)
                new_ids = choice["token_ids"]
                ids += new_ids
                texts.append(choice.get("text") or "")
                logprobs += choice["logprobs"]["token_logprobs"] if new_ids else []
                versions += choice.get("token_policy_versions") or [
                    choice.get("policy_version", server.policy_version)] * len(new_ids)
                exact = exact and bool(choice.get("versions_exact"))
                if choice["finish_reason"] != "abort" or len(ids) >= sampling.max_tokens:
                    break
                await self._wait_until_resumed(server)  # continue from the partial output
        finally:
            self._count_out(server)
        finish = choice["finish_reason"] if choice["finish_reason"] != "abort" else "length"
        # The last answer's routing covers the whole prompt and every continued part of it.
        routing = choice.get("routed_experts")
        return Completion(tuple(ids), tuple(logprobs), tuple(versions), finish,
                          "".join(texts), server.url, cached,
                          time.monotonic() - started,
                          None if routing is None else RoutedExperts.from_json(routing),
                          exact)

    async def _complete_once(self, server: _Server, prompt: list[int], sampling: Sampling,
                             max_tokens: int, session_id: str | None,
                             images: tuple[PlacedImage, ...] = ()) -> tuple[dict, int]:
        body: dict[str, Any] = {
            "max_tokens": max_tokens, "temperature": sampling.temperature,
            "top_p": sampling.top_p, "logprobs": 0, "return_token_ids": True}
        if images:
            body["prompt_chunks"] = prompt_chunks(prompt, images)
        if self.model:
            body["model"] = self.model
        if sampling.top_k:
            body["top_k"] = sampling.top_k
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if sampling.stop_token_ids:
            body["stop_token_ids"] = list(sampling.stop_token_ids)
        if sampling.ignore_eos:
            body["ignore_eos"] = True
        if self.routed_experts:
            body["return_routed_experts"] = True
        headers = {"Content-Type": "application/json"}
        if session_id:
            headers["X-Session-ID"] = session_id
        await self._known_card(server)
        if server.is_vllm:
            fields = vllm_routes.generate_fields(body)
            named = server.adapter  # what the request samples from (None: the base model)
            if named:
                fields["model"] = named
            data = completion_body(fields,
                                   self._prompt_text(prompt, session_id), key="token_ids")
            held = server.policy_version  # what its unlabelled tokens were sampled by
            reply = await self._request(server, "POST", vllm_routes.GENERATE, data=data,
                                        headers=headers)
            choice = vllm_routes.completion_choice(reply["choices"][0], held,
                                                   prompt_tokens=len(prompt),
                                                   routing_asked=self.routed_experts)
            if named or server.adapter:
                # LoRA: vLLM keeps a request on the adapter (or the base) it was sent with,
                # whatever loads meanwhile (measured), so that version sampled all of it,
                # whatever vLLM's version label says after a load.
                choice["token_policy_versions"] = [held] * len(choice["token_ids"])
        else:
            data = (json.dumps(body).encode() if images
                    else completion_body(body, self._prompt_text(prompt, session_id)))
            reply = await self._request(server, "POST", "/v1/completions", data=data,
                                        headers=headers)
            choice = reply["choices"][0]
        cached = (reply.get("usage") or {}).get("prompt_tokens_details") or {}
        return choice, int(cached.get("cached_tokens") or 0)

    def _prompt_text(self, prompt: list[int], session_id: str | None) -> str:
        if session_id is None:
            return ids_text(prompt)
        if session_id not in self._prompts and len(self._prompts) >= REMEMBERED_PROMPTS:
            del self._prompts[next(iter(self._prompts))]  # a caller that never ended a session
        return self._prompts.setdefault(session_id, PromptIds()).text(prompt)

    async def _wait_until_resumed(self, server: _Server) -> None:
        # The pause is the server's state, not an event of this process: poll it.
        while (await self._request(server, "GET", "/is_paused"))["is_paused"]:  # noqa: ASYNC110
            await asyncio.sleep(self.pause_poll_s)

    def _count_in(self, server: _Server) -> None:
        if self._busy_since is None:
            self._busy_since = time.monotonic()
        server.in_flight += 1

    def _count_out(self, server: _Server) -> None:
        server.in_flight -= 1
        if self._busy_since is not None and not any(s.in_flight for s in self.servers):
            self._busy_s += time.monotonic() - self._busy_since
            self._busy_since = None

    async def busy_seconds(self) -> float:
        """Seconds so far during which at least one generation was in flight (async so that a
        remote client answers the same call)."""
        ongoing = time.monotonic() - self._busy_since if self._busy_since is not None else 0.0
        return self._busy_s + ongoing

    # ---- control ---------------------------------------------------------------------------

    async def pause(self, mode: str = "keep") -> None:
        await self._fan_out("POST", "/pause", params={"mode": mode})

    async def resume(self) -> None:
        await self._fan_out("POST", "/resume")

    async def is_paused(self) -> bool:
        replies = await self._fan_out("GET", "/is_paused")
        return any(r["is_paused"] for r in replies)

    async def update_weights(self, path: str, version: int,
                             changed: ChangedWeights | None = None,
                             adapter: str | None = None) -> list[float]:
        """Load a safetensors file on every server (only `changed` on those that hold its
        `since_version`; vLLM with runtime LoRA loads `adapter`, the same weights as a PEFT
        adapter folder, instead); returns each server's seconds."""
        body: dict[str, Any] = {"path": str(path), "version": version}
        if changed is not None:
            body["changed"] = changed.to_json()
        replies = await asyncio.gather(*[self._update_one(s, body, adapter)
                                         for s in self.servers])
        for server in self.servers:
            server.policy_version = version
        return [float(r.get("seconds", 0.0)) for r in replies]

    async def send(self, update: WeightUpdate) -> list[float]:
        """The file transport (`model.weights.transport`): every server loads `update`'s file,
        or its adapter where that is what the server takes."""
        return await self.update_weights(str(update.path), update.version, update.changed,
                                         None if update.adapter is None else str(update.adapter))

    async def _update_one(self, server: _Server, body: dict[str, Any],
                          adapter: str | None = None) -> Any:
        """One server's update: as it is where the server swaps weights live, else between a
        pause(keep) and a resume (vLLM: its load must not run beside decoding)."""
        if (await self._known_card(server)).get("weight_swap") == "live":
            return await self._request(server, "POST", "/update_weights", json=body)
        await self._request(server, "POST", "/pause",
                            params=vllm_routes.PAUSE if server.is_vllm else {"mode": "keep"})
        try:
            if not server.is_vllm:
                return await self._request(server, "POST", "/update_weights", json=body)
            started = time.perf_counter()
            await self._vllm_update(server, body["path"], body["version"], adapter)
            return {"seconds": time.perf_counter() - started}
        finally:
            await self._request(server, "POST", "/resume")

    async def _vllm_update(self, server: _Server, path: str, version: int,
                           adapter: str | None) -> None:
        """The adapter where vLLM has runtime LoRA (a 404 says it has not: asked once), else
        the whole file, after which no adapter applies over it."""
        def request(*args: Any, **kwargs: Any) -> Any:
            return self._request(server, *args, **kwargs)

        if adapter is not None and server.takes_adapters is not False:
            try:
                await vllm_routes.load_adapter(request, adapter, version)
                server.adapter, server.takes_adapters = vllm_routes.POLICY_ADAPTER, True
                return
            except InferenceError as error:
                if error.status != 404 or server.takes_adapters:
                    raise
                server.takes_adapters = False
        await vllm_routes.update_weights(request, path, version)
        server.adapter = None

    async def max_model_len(self) -> int | None:
        """The smallest context length the servers report on /v1/models (None if unknown)."""
        cards = await asyncio.gather(*[self._model_card(s) for s in self.servers])
        lengths = [card.get("max_model_len") for card in cards]
        known = [n for n in lengths if isinstance(n, int) and n > 0]
        return min(known) if known else None

    async def _known_card(self, server: _Server) -> dict[str, Any]:
        """The server's model card, asked for once (what it is does not change)."""
        return server.card if server.card is not None else await self._model_card(server)

    async def _model_card(self, server: _Server) -> dict[str, Any]:
        """The first model card a server lists on /v1/models ({} when it lists none)."""
        try:
            cards = (await self._request(server, "GET", "/v1/models")).get("data") or []
        except InferenceError as error:  # a server without model cards: nothing to learn
            if error.status != 404:
                raise
            cards = []
        server.card = cards[0] if cards and isinstance(cards[0], dict) else {}
        return server.card

    async def health(self) -> bool:
        try:
            await self._fan_out("GET", "/health")
        except (InferenceError, aiohttp.ClientError):
            return False
        return True

    async def _fan_out(self, method: str, path: str, **kwargs: Any) -> list[Any]:
        return list(await asyncio.gather(
            *[self._request(s, method, path, **kwargs) for s in self.servers]))

    # ---- HTTP ------------------------------------------------------------------------------

    async def _request(self, server: _Server, method: str, path: str, **kwargs: Any) -> Any:
        try:  # the common case, without building a retry loop per call
            return await self._request_once(server, method, path, **kwargs)
        except (aiohttp.ClientConnectionError, _Retryable):
            pass
        retrying = AsyncRetrying(
            retry=retry_if_exception_type((aiohttp.ClientConnectionError, _Retryable)),
            wait=wait_exponential(multiplier=0.1, max=5.0),
            stop=stop_after_delay(self.retry_deadline_s), reraise=True)
        try:
            async for attempt in retrying:
                with attempt:
                    return await self._request_once(server, method, path, **kwargs)
        except _Retryable as exc:
            raise InferenceError(exc.args[0], exc.args[1], server.url) from None
        except aiohttp.ClientConnectionError as exc:
            raise InferenceError(0, f"no answer after retrying for {self.retry_deadline_s:.0f} s: "
                                    f"{exc}", server.url) from exc
        raise AssertionError("unreachable")

    async def _request_once(self, server: _Server, method: str, path: str,
                            **kwargs: Any) -> Any:
        if server.api_key:
            kwargs["headers"] = {**(kwargs.get("headers") or {}),
                                 "Authorization": f"Bearer {server.api_key}"}
        async with self._http(server).request(method, server.base + path, **kwargs) as response:
            if response.status in (502, 503, 504):
                raise _Retryable(response.status, await response.text())
            if response.status >= 400:
                raise InferenceError(response.status, await _error_message(response), server.url)
            if response.content_type == "application/json":
                return await response.json()
            return {}


async def _error_message(response: aiohttp.ClientResponse) -> str:
    text = await response.text()
    try:
        body = await response.json(content_type=None)
    except ValueError:
        return text.strip()[:500]
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("message", text))
    if isinstance(body, dict) and "message" in body:
        return str(body["message"])
    return text.strip()[:500]
