"""The torch backend: Tinker's primitives over a Hugging Face causal LM, on CPU or one GPU.

Data are split into micro-batches by a padded-token budget; gradients accumulate across them and
across forward_backward calls until optim_step. Weights reach the inference server through a
shared-memory safetensors file (`weight_sync`): on CPU the trained parameters live in that file,
so publishing them copies nothing on this side.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from skyrl_agent.atomic import atomic_folder
from skyrl_agent.backends.algorithms import entropy_BT, token_weights
from skyrl_agent.backends.backend import (
    AdamParams,
    Datum,
    ForwardBackwardOutput,
    OptimStepOutput,
    TrainingState,
)
from skyrl_agent.backends.heap import release_freed_heap
from skyrl_agent.backends.loss import LossConfig, MicroBatch, micro_batch_loss
from skyrl_agent.backends.loss import parse_loss_config as parse_loss_config
from skyrl_agent.backends.optimizer_state import by_name, by_position
from skyrl_agent.backends.passes import (
    STAND_IN,
    PartialPass,
    checked_call,
    merge_passes,
    micro_batches,
    pixel_inputs,
    rng_state,
    sampled_by,
    set_rng_state,
    stack,
    stack_routing,
    unpad,
)
from skyrl_agent.backends.weight_delta import MovedWeights, bytes_of
from skyrl_agent.model.loading import (
    LoraSettings,
    export_model,
    load_causal_lm,
    lora_layers,
    merged_lora_weights,
    pick_device,
    pick_dtype,
    save_adapter,
    server_parameters,
    trainable_parameters,
)
from skyrl_agent.model.routers import ReplayCount, find_routers, replayed_routing
from skyrl_agent.model.vision import ImageInputs, unsampled_image_token
from skyrl_agent.model.weights.files import (
    new_adapters_dir,
    new_weights_path,
    remove_orphans,
)
from skyrl_agent.model.weights.transport import WeightUpdate
from skyrl_agent.model.weights.writer import SharedWeights

log = logging.getLogger(__name__)


class TorchBackend:
    """A TrainerBackend over the model in `model_folder` (the folder the server serves)."""

    sends_deltas = True
    """Whether updates name what changed (a rank of a sharded backend sends everything)."""

    def __init__(self, model_folder: Path, *, lora: LoraSettings | None = None,
                 device: str | None = None, dtype: str = "auto",
                 micro_batch_tokens: int = 2048, seed: int = 0,
                 routing_replay: bool = False, frozen_base: Any = None) -> None:
        """`frozen_base`: a loaded base model whose weights this LoRA model shares (the Tinker
        server's tenants: one base in memory, an adapter each)."""
        torch.manual_seed(seed)
        random.seed(seed)
        self.model_folder = Path(model_folder)
        self.device = pick_device(device)
        self.dtype = pick_dtype(dtype, self.device)
        self.lora = lora
        self.micro_batch_tokens = micro_batch_tokens
        self.model = self._place(load_causal_lm(self.model_folder, self.dtype, self.device,
                                                lora, frozen_base))
        self.params = trainable_parameters(self.model)
        self.images = ImageInputs.for_model(self.model_folder)
        self.routing_replay = routing_replay
        if routing_replay and not find_routers(self.model):
            raise ValueError(f"routing_replay needs a mixture-of-experts model; "
                             f"{self.model_folder.name} has no MoE router layers")
        self.routing = ReplayCount()
        """Routing decisions of the current forward with a record, and how many of them the
        trainer's own routers would have made differently (reset before each policy forward;
        Megatron's routers hold this same object)."""
        self.optimizer = torch.optim.AdamW(list(self.params.values()), lr=0.0, foreach=False)
        self.step = 0
        self._reference: Any = None
        self._shared: SharedWeights | None = None
        self._adapters: Path | None = None
        """LoRA: where the adapter folders servers with runtime LoRA load live, one per version
        (see WeightUpdate.adapter)."""
        self._latest_adapter: Path | None = None
        self._moved = MovedWeights()
        """What the optimizer moved since the servers' last update."""

    # ---- Tinker primitives -----------------------------------------------------------------

    def forward(self, data: Sequence[Datum]) -> list[tuple[float, ...]]:
        out = self.forward_rows(data, self._micro_batches(data))
        return [out[i] for i in range(len(data))]

    def forward_backward(self, data: Sequence[Datum], loss_fn: str,
                         loss_fn_config: LossConfig | Mapping[str, Any] | None = None,
                         ) -> ForwardBackwardOutput:
        config = checked_call(data, loss_fn, loss_fn_config)
        return merge_passes(data, [self.partial_pass(data, loss_fn, config,
                                                     self._micro_batches(data))])

    def forward_rows(self, data: Sequence[Datum], plan: Sequence[Sequence[int]],
                     ) -> dict[int, tuple[float, ...]]:
        """Logprobs of the rows in `plan`'s micro-batches (an empty one runs the stand-in)."""
        out: dict[int, tuple[float, ...]] = {}
        with torch.no_grad():
            for rows in plan:
                part = [data[i] for i in rows] or [STAND_IN]
                logprobs_BT, _ = self._logprobs(self.model, part)
                out.update(zip(rows, unpad(logprobs_BT, part), strict=False))
        release_freed_heap()
        return out

    def partial_pass(self, data: Sequence[Datum], loss_fn: str, config: LossConfig,
                     plan: Sequence[Sequence[int]]) -> PartialPass:
        """Loss and gradient of the rows in `plan`'s micro-batches, as their share of the whole
        batch's loss (the reduction's weights come from every row); gradients accumulate."""
        reduction_BT = token_weights(stack(data, "weights"), config.reduction, config.norm_len)
        result = PartialPass()
        for rows in plan:
            part = [data[i] for i in rows] or [STAND_IN]
            self.routing.reset()  # count the policy's own forward only (not the KL reference's)
            logprobs_BT, logits_BTV = self._logprobs(self.model, part)
            routing = self.routing.share if self.routing.decisions else None
            width = logprobs_BT.shape[1]
            reduction = reduction_BT[rows, :width] if rows else torch.zeros(1, width)
            batch = MicroBatch(logprobs_BT, stack(part, "weights", self.device),
                               reduction.to(self.device), stack(part, "logprobs", self.device),
                               stack(part, "advantages", self.device),
                               self._reference_logprobs(part) if config.kl_coef > 0 else None)
            loss, metrics = micro_batch_loss(loss_fn, config, batch)
            if routing is not None:
                metrics["routing/differing"] = routing
            loss.backward()
            if not rows:
                continue
            result.loss += float(loss.detach())
            tokens = float(batch.weights_BT.gt(0).sum())
            for key, value in metrics.items():
                result.metric_sums[key] = result.metric_sums.get(key, 0.0) + value * tokens
            picked = batch.weights_BT > 0
            result.trainer_N.append(logprobs_BT.detach()[picked].cpu())
            result.sampler_N.append(batch.sampler_logprobs_BT[picked].cpu())
            result.current_N.append(sampled_by(part, self.step)[picked.cpu()])
            with torch.no_grad():
                result.entropy_N.append(self._entropy(logits_BTV.detach())[picked].cpu())
            result.logprobs.update(zip(rows, unpad(logprobs_BT.detach(), part), strict=True))
            del logits_BTV, loss
        release_freed_heap()
        return result

    def optim_step(self, adam: AdamParams) -> OptimStepOutput:
        limit = adam.grad_clip_norm if adam.grad_clip_norm > 0 else float("inf")
        grad_norm = self._clip_gradients(limit)
        for group in self.optimizer.param_groups:
            group.update(lr=adam.learning_rate, betas=(adam.beta1, adam.beta2), eps=adam.eps,
                         weight_decay=adam.weight_decay)
        self.optimizer.step()
        self._note_moved()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return OptimStepOutput(self.step, {"grad_norm": grad_norm,
                                           "learning_rate": adam.learning_rate})

    def save_state(self, path: Path, data_position: int = 0) -> None:
        """Written whole or not at all, and durably (see skyrl_agent.atomic); the newest wins."""
        # Copies: live parameters may be views into the shared-memory file.
        tensors = {name: p.detach().to("cpu", copy=True) for name, p in self.params.items()}
        with atomic_folder(Path(path), replace=True) as staging:
            save_file(tensors, staging / "weights.safetensors")
            torch.save({"optimizer": by_name(self.optimizer.state_dict(), list(self.params)),
                        "rng": rng_state()},
                       staging / "optimizer.pt")
            (staging / "state.json").write_text(json.dumps(
                {"step": self.step, "data_position": data_position}))

    def load_state(self, path: Path, optimizer: bool = True) -> TrainingState:
        path = Path(path)
        self._moved.forget()  # every weight may change: the next update carries all
        weights = load_file(path / "weights.safetensors")
        missing = set(self.params) - set(weights)
        if missing:
            raise ValueError(f"{path} does not fit this model: {len(missing)} parameters "
                             f"missing, e.g. {sorted(missing)[0]}")
        with torch.no_grad():
            for name, param in self.params.items():
                param.copy_(weights[name])
        if not optimizer:
            self.optimizer.state.clear()
            self.optimizer.zero_grad(set_to_none=True)
            state = json.loads((path / "state.json").read_text())
            return TrainingState(step=self.step, data_position=int(state["data_position"]))
        saved = torch.load(path / "optimizer.pt", weights_only=False)
        self.optimizer.load_state_dict(by_position(saved["optimizer"], list(self.params)))
        set_rng_state(saved["rng"])
        state = json.loads((path / "state.json").read_text())
        self.step = int(state["step"])
        return TrainingState(step=self.step, data_position=int(state["data_position"]))

    def save_weights_for_sampler(self, version: int) -> WeightUpdate:
        started = time.perf_counter()
        tensors = self._sampler_tensors()
        if self._shared is None:
            remove_orphans()
            self._shared = SharedWeights(new_weights_path(), tensors)
            if self.lora is None and self.device.type == "cpu":
                # From now on the optimizer writes straight into the shared file.
                self._shared.adopt(self.params)
        else:
            self._shared.write(tensors)
        changed = self._moved.changed(tensors) if self.sends_deltas else None
        nbytes = self._shared.nbytes if changed is None else bytes_of(changed, tensors)
        self._moved.sent(version)
        adapter = self._saved_adapter(version)
        return WeightUpdate(self._shared.path, version, nbytes, time.perf_counter() - started,
                            changed, adapter)

    def _saved_adapter(self, version: int) -> Path | None:
        """LoRA on a dense model: the adapters as a PEFT folder of their own for this version
        (vLLM serves adapted experts differently, so an MoE's go merged only). Never rewritten:
        vLLM reads an adapter's files when a request first uses it, which may come after the
        next version was saved (measured: tokens labelled with one version sampled by the
        next). The version before stays for such late readers; older ones go."""
        if self.lora is None or any(".experts." in name for name in lora_layers(self.model)):
            return None
        if self._adapters is None:
            self._adapters = new_adapters_dir()
        folder = self._adapters / f"version-{version}"
        save_adapter(self.model, folder)
        previous, self._latest_adapter = self._latest_adapter, folder
        for old in set(self._adapters.iterdir()) - {folder, previous}:
            shutil.rmtree(old, ignore_errors=True)
        return folder

    def close(self) -> None:
        if self._shared is not None:
            self._shared.close()
            self._shared = None
        if self._adapters is not None:
            shutil.rmtree(self._adapters, ignore_errors=True)
            self._adapters = None

    # ---- beyond Tinker -----------------------------------------------------------------------

    def export(self, target: Path) -> None:
        """Save a folder the inference server (`serve --model`) loads."""
        export_model(self.model, self.model_folder, Path(target))

    # ---- internals ---------------------------------------------------------------------------

    def _sampler_tensors(self) -> dict[str, torch.Tensor]:
        if self.lora is not None:
            return merged_lora_weights(self.model)
        return {name: p.detach() for name, p in server_parameters(self.model).items()}

    def _note_moved(self) -> None:
        """Keep count of what the step moved, for the next update's delta."""
        if self.sends_deltas:
            adapters = lora_layers(self.model) if self.lora is not None else None
            self._moved.note_step(self.optimizer, self.params, adapters)

    def _clip_gradients(self, limit: float) -> float:
        """Scale the gradient to a global norm of at most `limit`; the norm before."""
        norm = torch.nn.utils.clip_grad_norm_(list(self.params.values()), limit, foreach=False)
        return float(full(norm))

    def _entropy(self, logits_BTV: torch.Tensor) -> torch.Tensor:
        """[B, T]: the entropy of the next-token distribution at each position."""
        return entropy_BT(logits_BTV)

    def _place(self, model: Any) -> Any:
        """Where the loaded model (and the KL reference) runs: as is, in one process."""
        return model

    def _micro_batches(self, data: Sequence[Datum]) -> list[list[int]]:
        return micro_batches(data, range(len(data)), self.micro_batch_tokens)

    def _logprobs(self, model: Any, data: Sequence[Datum]) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row and position, log p(target | prefix); right-padded. Also the logits."""
        width = max(len(d.model_input) for d in data)
        input_ids = torch.zeros(len(data), width, dtype=torch.long)
        attention = torch.zeros(len(data), width, dtype=torch.long)
        for row, datum in enumerate(data):
            input_ids[row, : len(datum.model_input)] = torch.tensor(datum.model_input)
            attention[row, : len(datum.model_input)] = 1
        targets_BT = stack(data, "target_tokens", self.device)
        with self._routing(model, data, width):
            logits_BTV = model(input_ids=input_ids.to(self.device),
                               attention_mask=attention.to(self.device),
                               **pixel_inputs(self.images, data, self.device)).logits.float()
        logits_BTV = unsampled_image_token(logits_BTV, self.images)
        # gather - logsumexp: no full log_softmax copy of the [B, T, vocab] logits.
        picked_BT = logits_BTV.gather(-1, targets_BT.unsqueeze(-1)).squeeze(-1)
        return picked_BT - logits_BTV.logsumexp(-1), logits_BTV

    def _routing(self, model: Any, data: Sequence[Datum],
                 width: int) -> contextlib.AbstractContextManager[None]:
        """The sampler's recorded MoE routing replayed in this forward (R3), or, with replay
        off, only compared with the trainer's own choice (`routing/differing`)."""
        experts_BTLK = stack_routing(data, len(data), width)
        if experts_BTLK is None:
            return contextlib.nullcontext()
        return replayed_routing(model, experts_BTLK.flatten(0, 1), self.routing,
                                replay=self.routing_replay)

    def _reference_logprobs(self, data: Sequence[Datum]) -> torch.Tensor:
        """Logprobs under the initial policy: adapters off under LoRA, else a frozen copy."""
        with torch.no_grad():
            if self.lora is not None:
                with self.model.disable_adapter():
                    return self._logprobs(self.model, data)[0]
            if self._reference is None:
                self._reference = self._place(load_causal_lm(
                    self.model_folder, self.dtype, self.device, None))
            return self._logprobs(self._reference, data)[0]


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor behind a sharded one (a collective: every rank must call it)."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
