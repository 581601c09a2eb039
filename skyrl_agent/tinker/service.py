"""The Tinker service: sessions, training models, sampling sessions and their futures.

Requests arrive as the SDK's own pydantic request types (or a decoded protobuf call); each
mutating one returns a request id at once and runs in the background (`FutureStore`). Training
work runs on one worker thread, in each model's seq_id order; sampling runs in the embedded
servers, beside training.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from skyrl_agent.backends.backend import AdamParams
from skyrl_agent.inference.bounds import (
    MAX_METADATA_CHARS,
    MAX_METADATA_ENTRIES,
    MAX_N,
    MAX_TOPK_PROMPT_LOGPROBS,
    check_stop,
    check_stop_ids,
)
from skyrl_agent.inference.client import Sampling
from skyrl_agent.model.vision import Rendered
from skyrl_agent.tinker import training
from skyrl_agent.tinker.catalog import Catalog
from skyrl_agent.tinker.config import BaseModels, ServiceOptions
from skyrl_agent.tinker.errors import TinkerNotFound, TinkerUserError
from skyrl_agent.tinker.futures import FutureStore, Result
from skyrl_agent.tinker.images import prompt_with_images
from skyrl_agent.tinker.models import TrainingModel, lora_spec, make_backend
from skyrl_agent.tinker.ordering import SeqOrder
from skyrl_agent.tinker.proto import ForwardBackwardCall, encode_sample
from skyrl_agent.tinker.quotas import admit, trained_bytes
from skyrl_agent.tinker.sampling import Sampler
from skyrl_agent.tinker.store import ModelSpec, SamplerRef, Store

log = logging.getLogger(__name__)


class TinkerService:
    def __init__(self, options: ServiceOptions) -> None:
        self.options = options
        self.bases = BaseModels(list(options.models))
        self.store = Store(options.data_dir)
        self.catalog = Catalog(self.store)
        self.futures = FutureStore()
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="tinker-train")
        self.models: dict[str, TrainingModel] = {}
        self.samplers: dict[str, Sampler] = {}
        self.frozen_bases: dict[str, Any] = {}
        """Base name -> its weights, loaded once for every LoRA training model over it."""
        self._creating: dict[str, str] = {}

    async def close(self) -> None:
        await self.futures.close()
        await asyncio.gather(*(s.close() for s in self.samplers.values()))
        await asyncio.get_running_loop().run_in_executor(self.executor, self._close_backends)
        self.executor.shutdown(wait=True)

    def _close_backends(self) -> None:
        for model in self.models.values():
            model.backend.close()

    # ---- sessions ---------------------------------------------------------------------------

    def create_session(self, tenant: str, user_metadata: dict[str, Any] | None) -> str:
        _check_metadata(user_metadata)
        # Unguessable, though ids are no secret (a published checkpoint's run id holds its
        # session's): every use is checked against the caller's tenant.
        session_id = secrets.token_hex(16)
        self.catalog.record_session(session_id, tenant, user_metadata)
        return session_id

    async def finish_session(self, session_id: str, tenant: str) -> None:
        """Release the session's training models, after the requests already sent to them."""
        self.catalog.owned_session(session_id, tenant)
        self.catalog.finish_session(session_id, tenant)
        prefix = f"{session_id}:train:"
        for model_id in [m for m, model in self.models.items()
                         if m.startswith(prefix) and model.owner == tenant]:
            model = self.models.pop(model_id)
            self._creating.pop(model_id, None)

            async def close(model: TrainingModel = model) -> Result:
                return await self._in_worker(lambda: _closed(model))

            await model.order.run(None, close)
            log.info("model %s released (session finished)", model_id)

    def capabilities(self) -> dict[str, Any]:
        return {"supported_models": [
            {"model_name": b.name, "max_context_length": b.max_context, "trainable": True,
             "sampleable": True} for b in self.bases.models.values()]}

    # ---- training models --------------------------------------------------------------------

    def create_model(self, session_id: str, model_seq_id: int, base_model: str,
                     lora: Any, seed: int | None, tenant: str) -> str:
        model_id = self._new_model_id(session_id, model_seq_id, tenant)

        def create() -> Result:
            base = self.bases.get(base_model)
            spec = ModelSpec(base_model=base.name) if lora is None else lora_spec(
                base, lora.rank, lora.train_mlp, lora.train_attn, lora.train_unembed)
            self._add_model(model_id, spec, seed, tenant)
            return Result(json={"model_id": model_id, "type": "create_model"})

        return self._once(model_id, "CreateModel", tenant, lambda: self._in_worker(create))

    def create_from_state(self, session_id: str, model_seq_id: int, path: str,
                          optimizer: bool, tenant: str) -> str:
        """create_training_client_from_state: a new model whose first request is the load."""
        model_id = self._new_model_id(session_id, model_seq_id, tenant)

        def create_and_load() -> Result:
            checkpoint = self.catalog.readable(self.store.resolve(path, "weights"), tenant)
            model = self._add_model(model_id, checkpoint.spec, None, tenant)
            return training.load_state(model, checkpoint, optimizer)

        return self._once(model_id, "LoadWeights", tenant,
                          lambda: self._in_worker(create_and_load))

    def _new_model_id(self, session_id: str, model_seq_id: int, tenant: str) -> str:
        self.catalog.owned_session(session_id, tenant)
        return f"{session_id}:train:{model_seq_id}"

    def info(self, model_id: str, tenant: str) -> dict[str, Any]:
        model = self.model(model_id, tenant)
        return {"type": "get_info", "model_id": model_id, "is_lora": bool(model.spec.lora_rank),
                "lora_rank": model.spec.lora_rank, "model_name": model.base.name,
                "model_data": {"arch": model.base.arch, "model_name": model.base.name,
                               "tokenizer_id": str(model.base.folder)}}

    def model(self, model_id: str, tenant: str) -> TrainingModel:
        """A training model of `tenant`'s (another tenant's is as unknown as a missing one)."""
        if model_id not in self.models or self.models[model_id].owner != tenant:
            raise TinkerNotFound(
                f"unknown model {model_id!r}: not created on this server, or the server "
                "restarted since (training state lives in memory; load a saved state with "
                "create_training_client_from_state)")
        return self.models[model_id]

    def forward_backward(self, call: ForwardBackwardCall, tenant: str) -> str:
        kind = "Forward" if call.forward_only else "ForwardBackward"
        return self._ordered(call.model_id, call.seq_id, kind, tenant,
                             lambda m: training.forward_backward(m, call))

    def optim_step(self, model_id: str, seq_id: int | None, adam: AdamParams,
                   tenant: str) -> str:
        return self._ordered(model_id, seq_id, "OptimStep", tenant,
                             lambda m: training.optim_step(m, adam))

    def save_state(self, model_id: str, seq_id: int | None, name: str | None,
                   overwrite: bool, ttl_seconds: int | None, tenant: str) -> str:
        Catalog.check_ttl(ttl_seconds)  # before the save: refused afterwards, it would be kept

        def save(model: TrainingModel) -> Result:
            return training.save_state(model, self.store, name, overwrite, ttl_seconds)

        return self._ordered(model_id, seq_id, "SaveWeights", tenant, save)

    def load_state(self, model_id: str, seq_id: int | None, path: str, optimizer: bool,
                   tenant: str) -> str:
        def load(model: TrainingModel) -> Result:
            checkpoint = self.catalog.readable(self.store.resolve(path, "weights"), tenant)
            return training.load_state(model, checkpoint, optimizer)

        return self._ordered(model_id, seq_id, "LoadWeights", tenant, load)

    def save_for_sampler(self, model_id: str, seq_id: int | None, name: str | None,
                         sampling_session_seq_id: int | None, ttl_seconds: int | None,
                         tenant: str) -> str:
        Catalog.check_ttl(ttl_seconds)
        session = model_id.split(":train:")[0]
        sampling_id = None if sampling_session_seq_id is None else \
            f"{session}:sample:{sampling_session_seq_id}"
        return self._ordered(model_id, seq_id, "SaveWeightsForSampler", tenant,
                             lambda m: training.save_for_sampler(m, self.store, name, sampling_id,
                                                                 ttl_seconds))

    # ---- sampling ---------------------------------------------------------------------------

    def create_sampling_session(self, session_id: str, seq: int, base_model: str | None,
                                model_path: str | None, tenant: str) -> str:
        # Only in the caller's own session: another tenant's id would overwrite its record.
        self.catalog.owned_session(session_id, tenant)
        ref = self._sampler_ref(base_model, model_path, tenant)
        sampling_id = f"{session_id}:sample:{seq}"
        self.store.save_session(sampling_id, ref)
        return sampling_id

    def sampler_info(self, sampling_id: str, tenant: str) -> dict[str, Any]:
        ref = self._session(sampling_id, tenant)
        return {"sampler_id": sampling_id, "base_model": ref.base_model,
                "model_path": ref.model_path}

    def sample(self, request: Any, tenant: str) -> tuple[str, list[str]]:
        """An asample request: its request id and one sequence id per sample."""
        _check_sample_request(request)
        ref = self._session(request.sampling_session_id, tenant) \
            if request.sampling_session_id \
            else self._sampler_ref(request.base_model, request.model_path, tenant)
        base = self.bases.get(ref.base_model)
        prompt = _prompt(request.prompt, base.folder, base.name)
        sampling = _sampling(request.sampling_params)
        if base.name not in self.samplers:
            self.samplers[base.name] = Sampler(base, self.executor, self.options.max_batch_size,
                                               self.options.data_dir, self.options.engine)
        sampler = self.samplers[base.name]
        weights = Path(ref.weights) if ref.weights else None

        async def run() -> Result:
            sequences, scored = await sampler.sample(weights, prompt.ids, sampling,
                                                     request.num_samples,
                                                     bool(request.prompt_logprobs),
                                                     request.topk_prompt_logprobs, prompt.images)
            if scored is None:
                return Result(proto=encode_sample(sequences, None))
            logprobs = scored.logprobs if request.prompt_logprobs else None
            return Result(proto=encode_sample(sequences, logprobs, scored.topk))

        request_id = self.futures.submit("Sample", run(), tenant)
        return request_id, [f"{request_id}:{i}" for i in range(request.num_samples)]

    # ---- internals --------------------------------------------------------------------------

    def _add_model(self, model_id: str, spec: ModelSpec, seed: int | None,
                   owner: str) -> TrainingModel:
        """On the worker thread (one, so admissions never race): admit the model against its
        owner's quota, load the backend and register the model."""
        base = self.bases.get(spec.base_model)
        cost = trained_bytes(base, spec)
        admit(self.options.quota, owner, spec, cost,
              [m.memory for m in list(self.models.values()) if m.owner == owner])
        backend = make_backend(base, spec, seed, self.options, self.frozen_bases)
        model = TrainingModel(model_id, spec, base, backend, owner, SeqOrder(next_seq=1),
                              memory=cost)
        self.catalog.record_run(model_id, owner, spec)
        self.models[model_id] = model
        log.info("model %s: %s", model_id, training.describe(spec))
        return model

    def _once(self, model_id: str, kind: str, tenant: str,
              work: Callable[[], Coroutine[Any, Any, Result]]) -> str:
        """Creation requests: the same model created twice (a resent request) shares one."""
        if model_id in self._creating:
            return self._creating[model_id]
        if model_id in self.models:
            return self.futures.submit(kind, _fail(f"model {model_id} already exists"), tenant)
        request_id = self.futures.submit(kind, work(), tenant)
        self._creating[model_id] = request_id
        return request_id

    def _ordered(self, model_id: str, seq_id: int | None, kind: str, tenant: str,
                 work: Callable[[TrainingModel], Result]) -> str:
        try:
            model = self.model(model_id, tenant)
        except TinkerUserError as exc:
            return self.futures.submit(kind, _fail(str(exc)), tenant)
        if seq_id is not None and seq_id in model.seen:
            return model.seen[seq_id]  # the client sent it again: same future

        async def ordered() -> Result:
            return await model.order.run(seq_id, lambda: self._in_worker(lambda: work(model)))

        request_id = self.futures.submit(kind, ordered(), tenant)
        if seq_id is not None:
            model.seen[seq_id] = request_id
            for old in [s for s in model.seen if s < seq_id - 10_000]:
                del model.seen[old]
        return request_id

    async def _in_worker(self, work: Callable[[], Result]) -> Result:
        return await asyncio.get_running_loop().run_in_executor(self.executor, work)

    def _session(self, sampling_id: str, tenant: str) -> SamplerRef:
        ref = self.store.load_session(sampling_id)
        if ref is None or ref.owner != tenant:
            raise TinkerNotFound(f"unknown sampling session {sampling_id!r}")
        return ref

    def _sampler_ref(self, base_model: str | None, model_path: str | None,
                     tenant: str) -> SamplerRef:
        if model_path:
            checkpoint = self.catalog.readable(self.store.resolve(model_path, "sampler_weights"),
                                               tenant)
            return SamplerRef(base_model=checkpoint.spec.base_model, model_path=model_path,
                              weights=str(checkpoint.path / "weights.safetensors"), owner=tenant)
        return SamplerRef(base_model=self.bases.get(base_model).name, owner=tenant)


def _closed(model: TrainingModel) -> Result:
    model.backend.close()
    return Result(json=None)


async def _fail(message: str) -> Result:
    raise TinkerUserError(message)


def _check_sample_request(request: Any) -> None:
    if not 1 <= request.num_samples <= MAX_N:
        raise TinkerUserError(f"num_samples must be 1..{MAX_N}")
    if not 0 <= request.topk_prompt_logprobs <= MAX_TOPK_PROMPT_LOGPROBS:
        raise TinkerUserError(f"topk_prompt_logprobs must be 0..{MAX_TOPK_PROMPT_LOGPROBS}")
    stop = request.sampling_params.stop
    try:  # checked after every sampled token, by the sampler's server
        if isinstance(stop, str):
            check_stop(stop)
        elif stop is not None:
            check_stop([s for s in stop if isinstance(s, str)])
            check_stop_ids([s for s in stop if not isinstance(s, str)])
    except ValueError as exc:
        raise TinkerUserError(f"sampling_params.stop: {exc}") from None
    unsupported = [name for name in ("topk_sample_logprobs", "prompt_alt_tokens_k")
                   if getattr(request, name, 0)]
    unsupported += [name for name in ("target_prompt_logprobs", "prompt_logprobs_last_n")
                    if getattr(request, name, None) is not None]
    if unsupported:
        raise TinkerUserError(f"not supported by this server: {', '.join(unsupported)}")


def _check_metadata(metadata: dict[str, Any] | None) -> None:
    """A session's metadata is stored with it: bounded, as every field a client writes."""
    entries = list((metadata or {}).items())
    if len(entries) > MAX_METADATA_ENTRIES or any(
            len(str(k)) > MAX_METADATA_CHARS or len(str(v)) > MAX_METADATA_CHARS
            for k, v in entries):
        raise TinkerUserError(f"user_metadata: at most {MAX_METADATA_ENTRIES} entries of at "
                              f"most {MAX_METADATA_CHARS} characters each")


def _prompt(prompt: Any, folder: Path, name: str) -> Rendered:
    rendered = prompt_with_images(prompt.chunks, folder, name)
    if not rendered.ids:
        raise TinkerUserError("the prompt is empty")
    return rendered


def _sampling(params: Any) -> Sampling:
    """Tinker's SamplingParams: `stop` None keeps EOS, [] disables it, strings or token ids."""
    stop = params.stop
    strings: tuple[str, ...] = ()
    ids: tuple[int, ...] = ()
    if isinstance(stop, str):
        strings = (stop,)
    elif stop is not None:
        strings = tuple(s for s in stop if isinstance(s, str))
        ids = tuple(int(s) for s in stop if not isinstance(s, str))
    return Sampling(max_tokens=params.max_tokens or 128, temperature=params.temperature,
                    top_p=params.top_p, top_k=max(params.top_k, 0), seed=params.seed,
                    stop=strings, stop_token_ids=ids, ignore_eos=stop is not None and not stop)
