"""The generation engine: one thread that owns the model and runs continuous batching.

Every model forward, weight swap and batch change happens on the engine thread, between decode
steps, so there are no locks around the model. The asyncio side talks to it through an inbox of
callables and gets answers through futures.

Each loop iteration admits at most one waiting request (prefill, reusing a cached prefix when one
matches) into the running batch, then decodes one token for every running row. One request holds
at most half the batch's rows at once (its other samples wait their turn), so a request with
many samples cannot keep the others out of the batch. Pausing with
`keep` simply stops iterating: the rows and their KV cache stay where they are.

KV memory (running batch + prefix cache) stays within `kv_cache_mb`: see kv_budget.py. Weight
updates are staged beside decoding and swapped in between two steps: see weight_swap.py.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from transformers.cache_utils import DynamicCache

from skyrl_agent.inference.server.kv import KVBatch, held_after_prefill
from skyrl_agent.inference.server.kv_budget import KVBudget
from skyrl_agent.inference.server.outputs import EngineStats, SequenceOutput, WeightUpdateTimes
from skyrl_agent.inference.server.prefix_cache import PrefixCache, image_cache_key, whole_images
from skyrl_agent.inference.server.sampling import Choice, SamplingParams, choose, make_generator
from skyrl_agent.inference.server.weight_swap import DoubleBufferedWeights
from skyrl_agent.model.routers import RoutingTap
from skyrl_agent.model.vision import ImageInputs, text_config, unsampled_image_token
from skyrl_agent.model.weights.reader import WeightLoader
from skyrl_agent.types import ChangedWeights, PlacedImage

log = logging.getLogger(__name__)
PauseMode = Literal["keep", "wait", "abort"]


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    n: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[list[SequenceOutput]]
    max_length: int
    """The most tokens (prompt + sampled) a row of this request can reach."""
    admitted: int = 0
    """Rows already in the batch (or done): the first `admitted` of its `n`."""
    outputs: list[SequenceOutput | None] = field(default_factory=list)
    cached_tokens: int = 0
    prompt_routing: np.ndarray | None = None
    images: tuple[PlacedImage, ...] = ()
    """Vision models: the images in the prompt, each over its span of image tokens."""
    cache_key: list[int] = field(default_factory=list)
    """The prompt as the prefix cache sees it: each image's span marked with that image's
    own ids, so a cached prefix never stands in for a different picture."""


@dataclass
class _Row:
    request: _Request
    index: int
    generator: torch.Generator
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish: Literal["stop", "length", "abort"] | None = None
    text: str | None = None
    routing: list[np.ndarray] = field(default_factory=list)
    """MoE models: the experts chosen at each decode step (one row each)."""

    def routed_experts(self) -> np.ndarray | None:
        prompt = self.request.prompt_routing
        return None if prompt is None else np.concatenate([prompt, *self.routing])


class Engine:
    """Continuous batching over a transformers causal LM."""

    def __init__(self, model: Any, tokenizer: Any, *, max_batch_size: int = 32,
                 max_model_len: int | None = None, prefix_cache_tokens: int = 32768,
                 kv_cache_mb: float = 1024, policy_version: int = 0,
                 weights: WeightLoader | None = None,
                 images: ImageInputs | None = None) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.images = images
        self.max_batch_size = max_batch_size
        self.max_model_len = max_model_len or text_config(model.config).max_position_embeddings
        self.policy_version = policy_version
        self.eos_ids = _eos_ids(model, tokenizer)
        self.device = next(model.parameters()).device
        self._prefix = PrefixCache(prefix_cache_tokens)
        self.kv = KVBudget(self.model, self.device, kv_cache_mb, self._prefix)
        self._weights = weights or WeightLoader()
        self._buffers = DoubleBufferedWeights(self.model, self._weights)
        self._updating = asyncio.Lock()  # one update stages into the back buffers at a time
        self._tap = RoutingTap(model)
        self._inbox: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._waiting: deque[_Request] = deque()
        self._rows: list[_Row] = []
        self._batch: KVBatch | None = None
        self._paused = self._draining = self._closed = False
        self._pause_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._counts = dict.fromkeys(("requests", "prompt", "generated", "cached"), 0)
        self._recent: deque[tuple[float, int]] = deque()
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)

    # ---- asyncio side -------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        self._thread.join(timeout=10)
        self._weights.close()

    @property
    def is_paused(self) -> bool:
        return self._paused

    @property
    def moe_layers(self) -> int:
        """MoE router layers of the model (0 for a dense model)."""
        return len(self._tap.routers)

    async def generate(self, prompt_ids: list[int], params: SamplingParams, n: int = 1,
                       images: tuple[PlacedImage, ...] = ()) -> list[SequenceOutput]:
        """Sample `n` completions of `prompt_ids` (with `images` over their spans, checked by
        the caller); queued while the engine is paused."""
        loop = asyncio.get_running_loop()
        max_length = min(len(prompt_ids) + params.max_tokens, self.max_model_len)
        self.kv.check_alone(max_length, len(prompt_ids))
        request = _Request(list(prompt_ids), params, n, loop, loop.create_future(), max_length,
                           images=images, cache_key=image_cache_key(prompt_ids, images))
        request.outputs = [None] * n
        self._post(lambda: self._waiting.append(request))
        try:
            return await asyncio.shield(request.future)
        except asyncio.CancelledError:  # the HTTP client went away: free its rows
            self._post(lambda: self._abort_request(request))
            raise

    async def pause(self, mode: PauseMode) -> None:
        """keep: freeze running rows; wait: finish them first; abort: end them now (partial)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._post(lambda: self._begin_pause(mode, loop, future))
        await future

    async def resume(self) -> None:
        await self._call(self._resume)

    async def update_weights(self, path: str, version: int,
                             changed: ChangedWeights | None = None) -> WeightUpdateTimes:
        """Load weights from a safetensors file (only `changed`, when this engine holds its
        `since_version`) into the back buffers while decoding goes on, then serve them from
        the next decode step on."""
        async with self._updating:
            started = time.perf_counter()
            if changed is not None and changed.since_version != self.policy_version:
                changed = None  # this engine missed an update: take everything
            await asyncio.to_thread(self._buffers.stage, path,
                                    None if changed is None else changed.rows)
            staged = time.perf_counter()
            pause_s = await self._call(lambda: self._swap_weights(version))
            return WeightUpdateTimes(staged - started, pause_s)

    def stats(self) -> EngineStats:
        now = time.monotonic()
        recent = sum(n for t, n in list(self._recent) if now - t <= 10.0)
        return EngineStats(self._counts["requests"], self._counts["prompt"],
                           self._counts["generated"], self._counts["cached"], len(self._rows),
                           len(self._waiting), self._paused, self.policy_version, recent / 10.0,
                           self.kv.bytes, self.kv.used_bytes(self._batch), self.kv.peak_bytes)

    def _post(self, command: Callable[[], None]) -> None:
        self._inbox.put(command)
        self._wake.set()

    async def _call(self, fn: Callable[[], Any]) -> Any:
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def command() -> None:
            try:
                result = fn()
            except Exception as exc:  # noqa: BLE001 - handed to the caller
                _resolve(loop, future, exc=exc)
            else:
                _resolve(loop, future, result)

        self._post(command)
        return await future

    # ---- engine thread --------------------------------------------------------------------

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        while not self._closed:
            while True:
                try:
                    self._inbox.get_nowait()()
                except queue.Empty:
                    break
            if self._draining and not self._rows:
                self._enter_pause()
            busy = False
            try:
                admission = self._next_admission()
                if admission is not None:
                    busy = True
                    self._admit(*admission)
                if self._rows and not self._paused:
                    self._decode()
                    busy = True
            except Exception as exc:
                log.exception("engine step failed")
                self._fail_running(exc)
            self.kv.note(self._batch)
            if not busy:
                self._wake.wait(timeout=1.0)
                self._wake.clear()

    def _next_admission(self) -> tuple[_Request, int] | None:
        """The first waiting request that may add rows to the batch now, and how many (None:
        none). Requests are served in order; one that holds its share of the batch already
        lets the next one in rather than blocking it."""
        if self._paused or self._draining:
            return None
        for request in self._waiting:
            held = sum(row.request is request for row in self._rows)
            if held < self.row_share:
                rows = self._admissible_rows(request, self.row_share - held)
                return (request, rows) if rows else None
        return None

    @property
    def row_share(self) -> int:
        """The most rows one request holds in the batch at once."""
        return max(1, self.max_batch_size // 2)

    def _admissible_rows(self, request: _Request, share: int) -> int:
        """How many rows of `request` may join the batch now (0: none). The `n` samples of one
        request join in parts: within its share, and when the KV budget cannot take them at
        once."""
        rows = min(request.n - request.admitted, share,
                   self.max_batch_size - len(self._rows))
        # Every row is reserved at the longest reach in the batch (rows are padded to it).
        fits = (self.kv.tokens - len(request.prompt_ids)) // self._reach(request) - len(self._rows)
        return max(0, min(rows, fits))

    def _reach(self, joining: _Request | None = None) -> int:
        """The most tokens any row of the batch (with `joining`'s rows) can come to hold."""
        lengths = [r.request.max_length for r in self._rows]
        return max([*lengths, joining.max_length] if joining else lengths)

    def _admit(self, request: _Request, rows: int) -> None:
        first = request.admitted
        request.admitted += rows
        if request.admitted == request.n:
            self._waiting.remove(request)
        rows_before = len(self._rows)
        try:
            self._prefill(request, first, rows)
        except Exception as exc:
            log.exception("prefill failed")
            if request in self._waiting:  # rows of it still waiting: they go too
                self._waiting.remove(request)
            _resolve(request.loop, request.future, exc=RuntimeError(f"prefill failed: {exc}"))
            if len(self._rows) != rows_before:
                raise  # the batch changed under the failure: _run fails the running rows
            # Otherwise only this request failed (e.g. out of memory on a long prompt).

    def _prefill(self, request: _Request, first: int, count: int) -> None:
        """Prefill the prompt once for rows first .. first + count - 1 of the request."""
        prompt = request.prompt_ids
        max_length = self._reach(request)
        self.kv.make_room(held_after_prefill(self._batch, count, len(prompt), max_length),
                          beside=len(prompt))
        cached, layers, cached_routing = self._prefix.lookup(request.cache_key)
        cached, layers, cached_routing = whole_images(cached, layers, cached_routing,
                                                      request.images)
        cache = DynamicCache(ddp_cache_data=layers) if layers else DynamicCache()
        self._tap.discard()
        out = self.model(input_ids=torch.tensor([prompt[cached:]], device=self.device),
                         position_ids=torch.arange(cached, len(prompt), device=self.device)[None],
                         cache=cache, use_cache=True, logits_to_keep=1,
                         **self._pixel_inputs(request.images, cached))
        request.cached_tokens = cached
        if self._tap.active:
            new = self._tap.take()
            request.prompt_routing = new if cached_routing is None \
                else np.concatenate([cached_routing, new])
        self._counts["requests"] += first == 0
        self._counts["prompt"] += len(prompt)
        self._counts["cached"] += cached
        seed = request.params.seed
        rows = [_Row(request, i, make_generator(None if seed is None else seed + i))
                for i in range(first, first + count)]
        if self._batch is None:
            self._batch = KVBatch.from_prefill(out.cache, count, max_length)
        else:
            self._batch.add_prefill(out.cache, count, max_length)
        self.kv.note(self._batch, beside_tokens=len(prompt))  # the prefill's own KV
        self._rows.extend(rows)
        logits = unsampled_image_token(out.logits[:, -1], self.images).expand(count, -1)
        self._append(rows, choose(logits, [request.params] * count,
                                  [r.generator for r in rows]))

    def _pixel_inputs(self, images: tuple[PlacedImage, ...], cached: int) -> dict[str, Any]:
        """The pixel inputs of the images the prefill still runs (those the cache lacks)."""
        pending = [image.data for image in images if image.offset >= cached]
        if not pending:
            return {}
        assert self.images is not None  # the server accepts images only for a vision model
        return self.images.model_kwargs(pending, self.device)

    def _decode(self) -> None:
        assert self._batch is not None
        rows = self._rows
        last = torch.tensor([[r.tokens[-1]] for r in rows], device=self.device)
        positions = torch.tensor([[len(r.request.prompt_ids) + len(r.tokens) - 1] for r in rows],
                                 device=self.device)
        self.kv.make_room(self._batch.held_tokens(self._batch.width + 1))  # the step may grow it
        mask = self._batch.append_mask_column()
        self._tap.discard()
        out = self.model(input_ids=last, attention_mask=mask, position_ids=positions,
                         cache=self._batch.cache, use_cache=True)
        if self._tap.active:
            chosen = self._tap.take()  # one row per running row: each decoded one token
            for i, row in enumerate(rows):
                row.routing.append(chosen[i : i + 1])
        logits = unsampled_image_token(out.logits[:, -1], self.images)
        self._append(rows, choose(logits, [r.request.params for r in rows],
                                  [r.generator for r in rows]))

    def _append(self, rows: list[_Row], choices: list[Choice]) -> None:
        for row, choice in zip(rows, choices, strict=True):
            row.tokens.append(choice.token_id)
            row.logprobs.append(choice.logprob)
            row.tops.append(choice.top)
            row.versions.append(self.policy_version)
            row.finish = self._finish_reason(row)
        self._counts["generated"] += len(rows)
        self._recent.append((time.monotonic(), len(rows)))
        while self._recent and time.monotonic() - self._recent[0][0] > 10.0:
            self._recent.popleft()
        self._retire_finished()

    def _finish_reason(self, row: _Row) -> Literal["stop", "length"] | None:
        params, token = row.request.params, row.tokens[-1]
        if token in params.stop_token_ids or (token in self.eos_ids and not params.ignore_eos):
            return "stop"
        if params.stop and self._stop_in_tail(row, params.stop):
            text = self.tokenizer.decode(row.tokens, skip_special_tokens=True)
            hits = [i for i in (text.find(s) for s in params.stop) if i >= 0]
            if hits:
                row.text = text[: min(hits)]
                return "stop"
        if len(row.tokens) >= params.max_tokens:
            return "length"
        if len(row.request.prompt_ids) + len(row.tokens) >= self.max_model_len:
            return "length"
        return None

    def _stop_in_tail(self, row: _Row, stops: tuple[str, ...]) -> bool:
        """Whether a stop string may have just completed: decodes only the last few tokens
        (every token is at least one character), not the whole output, on each step."""
        window = max(len(s) for s in stops) + 4
        tail = self.tokenizer.decode(row.tokens[-window:], skip_special_tokens=True)
        return any(s in tail for s in stops)

    def _retire_finished(self) -> None:
        done = [i for i, r in enumerate(self._rows) if r.finish is not None]
        if not done:
            return
        assert self._batch is not None
        held = self._batch.held_tokens()
        for i in done:
            row = self._rows[i]
            routing = row.routed_experts()  # joined once, for the cache and the answer
            known = row.request.cache_key + row.tokens[:-1]  # the last token has no KV yet
            if row.finish != "abort" and held + len(known) <= self.kv.tokens:
                self.kv.make_room(held, beside=len(known))  # the copy must fit beside the batch
                self._prefix.store(known, self._batch.row(i, len(known)), routing)
            self._finish_row(row, routing)
        self.kv.note(self._batch)  # the finished rows' copies are in the cache, not yet cut
        keep = [i for i, r in enumerate(self._rows) if r.finish is None]
        self._rows = [self._rows[i] for i in keep]
        if not keep:
            self._batch = None
            return
        self._batch.select(keep, self._reach())

    def _finish_row(self, row: _Row, routing: np.ndarray | None) -> None:
        assert row.finish is not None
        text = row.text
        if text is None:
            text = self.tokenizer.decode(row.tokens, skip_special_tokens=True)
        request = row.request
        request.outputs[row.index] = SequenceOutput(
            tuple(row.tokens), tuple(row.logprobs), tuple(row.tops), tuple(row.versions),
            row.finish, text, request.cached_tokens, routing)
        if all(o is not None for o in request.outputs):
            _resolve(request.loop, request.future, list(request.outputs))

    def _abort_request(self, request: _Request) -> None:
        if request in self._waiting:
            self._waiting.remove(request)
        for row in self._rows:
            if row.request is request:
                row.finish = "abort"
        if self._batch is not None:
            self._retire_finished()

    def _fail_running(self, exc: Exception) -> None:
        for request in {id(r.request): r.request for r in self._rows}.values():
            _resolve(request.loop, request.future, exc=RuntimeError(f"generation failed: {exc}"))
        self._rows, self._batch = [], None

    def _begin_pause(self, mode: PauseMode, loop: asyncio.AbstractEventLoop,
                     future: asyncio.Future[None]) -> None:
        self._pause_waiters.append((loop, future))
        if mode == "abort":
            for row in self._rows:
                row.finish = "abort"
            if self._rows:
                self._retire_finished()
        if mode == "wait" and self._rows:
            self._draining = True
        else:
            self._enter_pause()

    def _enter_pause(self) -> None:
        self._paused, self._draining = True, False
        for loop, future in self._pause_waiters:
            _resolve(loop, future, None)
        self._pause_waiters.clear()

    def _resume(self) -> None:
        self._paused = self._draining = False

    def _swap_weights(self, version: int) -> float:
        started = time.perf_counter()
        self._buffers.swap()
        self.policy_version = version
        self._prefix.clear()  # cached KV was computed by the old weights
        return time.perf_counter() - started


def _resolve(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], result: Any = None,
             exc: BaseException | None = None) -> None:
    def settle() -> None:
        if future.done():
            return
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)

    loop.call_soon_threadsafe(settle)


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    generation = getattr(model, "generation_config", None)
    for value in (getattr(generation, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(value)
    return frozenset(ids)

