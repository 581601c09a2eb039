"""Sampling: one inference server (embedded or vLLM) per base model, loaded with exactly the
weights a sampling session names.

Several sampling sessions (base weights, different sampler checkpoints) share their base
model's one server; the server holds one set of weights at a time. A `WeightsGate` lets every
request on the loaded weights run together (the server batches them) and makes a request for
other weights wait until those drain, then loads its file with `/update_weights`. One server
per base keeps memory at one model copy; the price is a reload when clients alternate
between weights.

Sampler files may hold a subset of the parameters (LoRA: the merged adapted layers). The gate
tracks which parameters differ from the base; when the next file does not cover them all, the
base model's own safetensors files are loaded first, so nothing of an earlier file lingers.

Prompt logprobs come from a scorer: a forward pass of a torch copy of the same base model with
the same file loaded, as Tinker's `prompt_logprobs` (NaN at position 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from skyrl_agent.backends.backend import Datum
from skyrl_agent.inference.client import InferenceClient, InferenceError, Sampling
from skyrl_agent.inference.process import ServerProcess, embedded_server
from skyrl_agent.tinker.config import BaseInfo
from skyrl_agent.tinker.errors import TinkerUserError
from skyrl_agent.tinker.proto import SampledSequence
from skyrl_agent.types import PlacedImage

log = logging.getLogger(__name__)


def tensor_names(path: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        return set(handle.keys())


PARTIAL = "\0partial"
"""The key of a model copy whose last load did not finish."""


@dataclass
class LoadedWeights:
    """Which weights a model copy holds, and which parameters differ from the base."""

    key: str | None = None
    """The sampler file loaded last (None: the base weights)."""
    dirty: frozenset[str] = frozenset()

    def plan(self, target: Path | None, base_files: Sequence[Path],
             ) -> tuple[list[Path], LoadedWeights]:
        """Files to load, in order, so that the copy holds exactly `target`, and what it holds
        once they are loaded (the caller keeps that only when every load succeeded)."""
        names = frozenset(tensor_names(target)) if target else frozenset()
        files: list[Path] = []
        dirty = self.dirty
        if dirty - names:
            files += base_files
            dirty = frozenset()
        if target is not None:
            files.append(target)
            dirty = dirty | names
        return files, LoadedWeights(str(target) if target else None, dirty)

    def interrupted(self, loaded: LoadedWeights) -> LoadedWeights:
        """The state while a load is under way (or after it failed): no known file, and every
        name either side touches counted as changed, so the next load starts from the base."""
        return LoadedWeights(PARTIAL, self.dirty | loaded.dirty)


class WeightsGate:
    """Requests on the loaded weights run together; others wait, then load theirs."""

    def __init__(self) -> None:
        self.current: str | None = None
        """The key of the weights on the server (None: the base)."""
        self.active = 0
        self._changed = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def holding(self, key: str | None,
                      load: Callable[[], Awaitable[None]]) -> AsyncIterator[None]:
        async with self._changed:
            while self.current != key and self.active:
                await self._changed.wait()
            if self.current != key:
                self.current = PARTIAL  # a load that fails half-way forces the next to reload
                await load()
                self.current = key
            self.active += 1
        try:
            yield
        finally:
            async with self._changed:
                self.active -= 1
                self._changed.notify_all()


class Sampler:
    """The sampling side of one base model."""

    def __init__(self, base: BaseInfo, executor: Executor, max_batch_size: int = 32,
                 log_dir: Path | None = None, engine: str = "embedded") -> None:
        self.base = base
        self.engine = engine
        self.executor = executor
        self.max_batch_size = max_batch_size
        self.log_dir = log_dir
        """The server's data dir: sampler logs and sampler weights live under it."""
        self.base_files = sorted(base.folder.glob("*.safetensors"))
        self.gate = WeightsGate()
        self._server_weights = LoadedWeights()
        self._scorer_weights = LoadedWeights()
        self._process: ServerProcess | None = None
        self._client: InferenceClient | None = None
        self._scorer: Any = None
        self._start_lock = asyncio.Lock()
        self._scorer_lock = asyncio.Lock()
        self._version = 0

    async def sample(self, weights: Path | None, prompt: list[int], sampling: Sampling, n: int,
                     prompt_logprobs: bool, topk: int = 0, images: tuple[PlacedImage, ...] = (),
                     ) -> tuple[list[SampledSequence], PromptScores | None]:
        """n samples of `prompt` (showing `images`) under `weights` (None: the base), and its
        prompt logprobs (with the top `topk` at each position) when asked."""
        if weights is not None and not await asyncio.to_thread(weights.is_file):
            raise TinkerUserError("these sampler weights are gone (ephemeral weights are "
                                  "kept for the newest few saves only)")
        client = await self._started()
        key = str(weights) if weights else None
        async with self.gate.holding(key, lambda: self._load_server(client, weights)):
            seeds = [None if sampling.seed is None else sampling.seed + i for i in range(n)]
            try:
                completions = await asyncio.gather(*[
                    client.complete(prompt, _with_seed(sampling, seed), images=images)
                    for seed in seeds])
            except InferenceError as exc:
                if 400 <= exc.status < 500:
                    raise TinkerUserError(exc.message) from None
                raise
            scored = await self._score(weights, prompt, topk, images) \
                if prompt_logprobs or topk else None
        sequences = [SampledSequence(c.token_ids, c.logprobs,
                                     "length" if c.finish_reason == "length" else "stop")
                     for c in completions]
        return sequences, scored

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
        if self._process is not None:
            await asyncio.to_thread(self._process.stop)

    async def _started(self) -> InferenceClient:
        async with self._start_lock:
            if self._client is None:
                log_path = self.log_dir / f"sampler-{_safe(self.base.name)}.log" \
                    if self.log_dir else None
                process = self._server(log_path)
                url = await asyncio.to_thread(process.start)
                self._process = process
                self._client = InferenceClient([url], api_keys=[process.api_key])
                log.info("sampler for %s at %s", self.base.name, url)
            return self._client

    def _server(self, log_path: Path | None) -> ServerProcess:
        if self.engine == "vllm":
            from skyrl_agent.inference.vllm.launch import VLLMOptions, vllm_server

            return vllm_server(VLLMOptions(model=str(self.base.folder),
                                           weight_folders=tuple(self._weights_dirs())),
                               log_path=log_path)
        return embedded_server(str(self.base.folder), max_batch_size=self.max_batch_size,
                               log_path=log_path, weights_dirs=self._weights_dirs())

    def _weights_dirs(self) -> list[Path]:
        """What the server may load: sampler weights under the data dir, and the base model's
        files wherever their links lead (a Hugging Face cache links them into its blobs)."""
        folders = {self.base.folder.resolve(), *(f.resolve().parent for f in self.base_files)}
        if self.log_dir is not None:
            folders.add(self.log_dir.resolve())
        return sorted(folders)

    async def _load_server(self, client: InferenceClient, weights: Path | None) -> None:
        files, loaded = self._server_weights.plan(weights, self.base_files)
        self._server_weights = self._server_weights.interrupted(loaded)
        for path in files:
            self._version += 1
            # The server follows no links: send the file's real path.
            await client.update_weights(str(path.resolve()), self._version)
        self._server_weights = loaded

    async def _score(self, weights: Path | None, prompt: list[int], topk: int,
                     images: tuple[PlacedImage, ...] = ()) -> PromptScores:
        if len(prompt) < 2:
            return PromptScores([math.nan] * len(prompt), _top(None, prompt, topk))
        if images and (topk or images[-1].end >= len(prompt)):
            raise TinkerUserError("prompt logprobs of a prompt with images need a token after "
                                  "its last image, and no top-k")
        async with self._scorer_lock:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self.executor, self._score_sync, weights, prompt,
                                              topk, images)

    def _score_sync(self, weights: Path | None, prompt: list[int], topk: int,
                    images: tuple[PlacedImage, ...] = ()) -> PromptScores:
        from safetensors.torch import load_file

        from skyrl_agent.backends.torch_backend import TorchBackend

        if self._scorer is None:
            self._scorer = TorchBackend(self.base.folder)
        if self._scorer_weights.key != (str(weights) if weights else None):
            files, loaded = self._scorer_weights.plan(weights, self.base_files)
            self._scorer_weights = self._scorer_weights.interrupted(loaded)
            params = dict(self._scorer.model.named_parameters())
            for path in files:
                for name, tensor in load_file(path).items():
                    if name in params:
                        params[name].data.copy_(tensor)
            self._scorer_weights = loaded
        datum = Datum(tuple(prompt[:-1]), {"target_tokens": tuple(prompt[1:])},
                      images=images)
        (logprobs,) = self._scorer.forward([datum])  # the training forward's own code path
        return PromptScores([math.nan, *logprobs], _top(self._scorer, prompt, topk))


@dataclass(frozen=True)
class PromptScores:
    """What a sample request asked about its prompt."""

    logprobs: list[float]
    """Per prompt position, log p(token | the tokens before it); NaN at position 0."""
    topk: tuple[Any, Any] | None = None
    """Token ids (int32) and logprobs (float32), each [len(prompt), k]: the k likeliest next
    tokens at each position, Tinker's sentinel (id 0, logprob -99999) in row 0."""


def _top(scorer: Any, prompt: list[int], k: int) -> tuple[Any, Any] | None:
    import numpy as np
    import torch

    if not k:
        return None
    ids = np.zeros((len(prompt), k), dtype=np.int32)
    logprobs = np.full((len(prompt), k), -99999.0, dtype=np.float32)
    if scorer is not None and len(prompt) > 1:
        with torch.no_grad():
            inputs = torch.tensor([prompt[:-1]], device=scorer.device)
            logp_TV = scorer.model(input_ids=inputs).logits.float()[0].log_softmax(-1)
            top = logp_TV.topk(min(k, logp_TV.shape[-1]), dim=-1)
        width = top.indices.shape[-1]
        ids[1:, :width] = top.indices.cpu().numpy()
        logprobs[1:, :width] = top.values.cpu().numpy()
    return ids, logprobs


def _with_seed(sampling: Sampling, seed: int | None) -> Sampling:
    return replace(sampling, seed=seed)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
