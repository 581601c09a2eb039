"""The torch backend: Tinker's primitives over a Hugging Face causal LM, on CPU or one GPU.

Data are split into micro-batches by a padded-token budget; gradients accumulate across them and
across forward_backward calls until optim_step. Weights reach the inference server through a
shared-memory safetensors file (`weight_sync`): on CPU the trained parameters live in that file,
so publishing them copies nothing on this side.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from skyrl_agent.atomic import atomic_folder
from skyrl_agent.inference.weight_files import new_weights_path, remove_orphans
from skyrl_agent.trainers.algorithms import entropy_BT, token_weights
from skyrl_agent.trainers.backend import (
    AdamParams,
    Datum,
    ForwardBackwardOutput,
    OptimStepOutput,
    TrainingState,
    WeightUpdate,
)
from skyrl_agent.trainers.loss import (
    LOSS_FNS,
    LossConfig,
    MicroBatch,
    agreement,
    micro_batch_loss,
)
from skyrl_agent.trainers.loss import parse_loss_config as parse_loss_config
from skyrl_agent.trainers.torch_model import (
    LoraSettings,
    export_model,
    load_causal_lm,
    merged_lora_weights,
    pick_device,
    pick_dtype,
    server_parameters,
    trainable_parameters,
)
from skyrl_agent.trainers.weight_sync import SharedWeights

log = logging.getLogger(__name__)


class TorchBackend:
    """A TrainerBackend over the model in `model_folder` (the folder the server serves)."""

    def __init__(self, model_folder: Path, *, lora: LoraSettings | None = None,
                 device: str | None = None, dtype: str = "auto",
                 micro_batch_tokens: int = 2048, seed: int = 0) -> None:
        torch.manual_seed(seed)
        random.seed(seed)
        self.model_folder = Path(model_folder)
        self.device = pick_device(device)
        self.dtype = pick_dtype(dtype, self.device)
        self.lora = lora
        self.micro_batch_tokens = micro_batch_tokens
        self.model = load_causal_lm(self.model_folder, self.dtype, self.device, lora)
        self.params = trainable_parameters(self.model)
        self.optimizer = torch.optim.AdamW(list(self.params.values()), lr=0.0, foreach=False)
        self.step = 0
        self._reference: Any = None
        self._shared: SharedWeights | None = None

    # ---- Tinker primitives -----------------------------------------------------------------

    def forward(self, data: Sequence[Datum]) -> list[tuple[float, ...]]:
        out: list[tuple[float, ...]] = []
        with torch.no_grad():
            for rows in self._micro_batches(data):
                logprobs_BT, _ = self._logprobs(self.model, [data[i] for i in rows])
                out.extend(_unpad(logprobs_BT, [data[i] for i in rows]))
        return out

    def forward_backward(self, data: Sequence[Datum], loss_fn: str,
                         loss_fn_config: LossConfig | Mapping[str, Any] | None = None,
                         ) -> ForwardBackwardOutput:
        config = parse_loss_config(loss_fn_config)
        if loss_fn not in LOSS_FNS:
            raise ValueError(f"unknown loss_fn {loss_fn!r}; known: {', '.join(LOSS_FNS)}")
        if not data:
            raise ValueError("forward_backward needs at least one datum")
        reduction_BT = token_weights(_stack(data, "weights"), config.reduction, config.norm_len)
        total = 0.0
        logprobs: list[tuple[float, ...]] = []
        sums: dict[str, float] = {}
        trainer_N, sampler_N, current_N, entropy_N = [], [], [], []
        for rows in self._micro_batches(data):
            part = [data[i] for i in rows]
            logprobs_BT, logits_BTV = self._logprobs(self.model, part)
            batch = MicroBatch(logprobs_BT, _stack(part, "weights", self.device),
                               reduction_BT[rows, : logprobs_BT.shape[1]].to(self.device),
                               _stack(part, "logprobs", self.device),
                               _stack(part, "advantages", self.device),
                               self._reference_logprobs(part) if config.kl_coef > 0 else None)
            loss, metrics = micro_batch_loss(loss_fn, config, batch)
            loss.backward()
            total += float(loss.detach())
            tokens = float(batch.weights_BT.gt(0).sum())
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + value * tokens
            picked = batch.weights_BT > 0
            trainer_N.append(logprobs_BT.detach()[picked].cpu())
            sampler_N.append(batch.sampler_logprobs_BT[picked].cpu())
            current_N.append(_sampled_by(part, self.step)[picked.cpu()])
            with torch.no_grad():
                entropy_N.append(entropy_BT(logits_BTV.detach())[picked].cpu())
            logprobs.extend(_unpad(logprobs_BT.detach(), part))
            del logits_BTV, loss
        tokens = sum(d.num_loss_tokens for d in data)
        metrics = {key: value / max(tokens, 1) for key, value in sums.items()}
        metrics["loss"] = total
        metrics["tokens"] = float(tokens)
        metrics["entropy"] = float(torch.cat(entropy_N).mean()) if tokens else 0.0
        if any("logprobs" in d.loss_fn_inputs for d in data):
            # Agreement on the tokens the current weights sampled (a bug detector); the rest
            # measure how off-policy the batch is.
            trainer, sampler, current = (torch.cat(trainer_N), torch.cat(sampler_N),
                                         torch.cat(current_N))
            metrics.update(agreement(trainer[current], sampler[current]))
            if not bool(current.all()):
                stale = agreement(trainer[~current], sampler[~current])
                metrics.update({k.replace("agreement/", "off_policy/"): v
                                for k, v in stale.items()})
        return ForwardBackwardOutput(total, tuple(logprobs), metrics)

    def optim_step(self, adam: AdamParams) -> OptimStepOutput:
        params = list(self.params.values())
        limit = adam.grad_clip_norm if adam.grad_clip_norm > 0 else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, limit, foreach=False))
        for group in self.optimizer.param_groups:
            group.update(lr=adam.learning_rate, betas=(adam.beta1, adam.beta2), eps=adam.eps,
                         weight_decay=adam.weight_decay)
        self.optimizer.step()
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
            torch.save({"optimizer": self.optimizer.state_dict(), "rng": _rng_state()},
                       staging / "optimizer.pt")
            (staging / "state.json").write_text(json.dumps(
                {"step": self.step, "data_position": data_position}))

    def load_state(self, path: Path, optimizer: bool = True) -> TrainingState:
        path = Path(path)
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
        self.optimizer.load_state_dict(saved["optimizer"])
        _set_rng_state(saved["rng"])
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
        return WeightUpdate(self._shared.path, version, self._shared.nbytes,
                            time.perf_counter() - started)

    def close(self) -> None:
        if self._shared is not None:
            self._shared.close()
            self._shared = None

    # ---- beyond Tinker -----------------------------------------------------------------------

    def export(self, target: Path) -> None:
        """Save a folder the inference server (`serve --model`) loads."""
        export_model(self.model, self.model_folder, Path(target))

    # ---- internals ---------------------------------------------------------------------------

    def _sampler_tensors(self) -> dict[str, torch.Tensor]:
        if self.lora is not None:
            return merged_lora_weights(self.model)
        return {name: p.detach() for name, p in server_parameters(self.model).items()}

    def _micro_batches(self, data: Sequence[Datum]) -> Iterator[list[int]]:
        """Consecutive rows whose padded size fits micro_batch_tokens (a longer row alone)."""
        rows: list[int] = []
        longest = 0
        for index, datum in enumerate(data):
            length = len(datum.model_input)
            if rows and max(longest, length) * (len(rows) + 1) > self.micro_batch_tokens:
                yield rows
                rows, longest = [], 0
            rows.append(index)
            longest = max(longest, length)
        if rows:
            yield rows

    def _logprobs(self, model: Any, data: Sequence[Datum]) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row and position, log p(target | prefix); right-padded. Also the logits."""
        width = max(len(d.model_input) for d in data)
        input_ids = torch.zeros(len(data), width, dtype=torch.long)
        attention = torch.zeros(len(data), width, dtype=torch.long)
        for row, datum in enumerate(data):
            input_ids[row, : len(datum.model_input)] = torch.tensor(datum.model_input)
            attention[row, : len(datum.model_input)] = 1
        targets_BT = _stack(data, "target_tokens").long().to(self.device)
        logits_BTV = model(input_ids=input_ids.to(self.device),
                           attention_mask=attention.to(self.device)).logits.float()
        # gather - logsumexp: no full log_softmax copy of the [B, T, vocab] logits.
        picked_BT = logits_BTV.gather(-1, targets_BT.unsqueeze(-1)).squeeze(-1)
        return picked_BT - logits_BTV.logsumexp(-1), logits_BTV

    def _reference_logprobs(self, data: Sequence[Datum]) -> torch.Tensor:
        """Logprobs under the initial policy: adapters off under LoRA, else a frozen copy."""
        with torch.no_grad():
            if self.lora is not None:
                with self.model.disable_adapter():
                    return self._logprobs(self.model, data)[0]
            if self._reference is None:
                self._reference = load_causal_lm(self.model_folder, self.dtype, self.device,
                                                 None)
            return self._logprobs(self._reference, data)[0]


def _stack(data: Sequence[Datum], name: str, device: torch.device | None = None,
           ) -> torch.Tensor:
    """A named per-position array of every datum, right-padded with zeros: [B, T]."""
    width = max((len(d.model_input) for d in data), default=0)
    out = torch.zeros(len(data), width, dtype=torch.float32)
    for row, datum in enumerate(data):
        if name in datum.loss_fn_inputs:
            out[row, : len(datum.model_input)] = torch.tensor(datum.loss_fn_inputs[name],
                                                              dtype=torch.float64)
    return out if device is None else out.to(device)


def _sampled_by(data: Sequence[Datum], version: int) -> torch.Tensor:
    """[B, T]: True where a sampled token came from `version` with no older token before it in
    its turn. A turn that spans a weight update continues on a KV cache the old weights wrote,
    so even its newer tokens are not exactly the new policy's: agreement leaves them out."""
    width = max(len(d.model_input) for d in data)
    out = torch.zeros(len(data), width, dtype=torch.bool)
    for row, datum in enumerate(data):
        weights = datum.array("weights")
        versions = datum.loss_fn_inputs.get("policy_versions")
        clean = True
        for i, weight in enumerate(weights):
            if not weight:
                clean = True  # a turn's sampled tokens are contiguous; a gap starts the next
                continue
            clean = clean and (versions is None or versions[i] == version)
            out[row, i] = clean
    return out


def _unpad(values_BT: torch.Tensor, data: Sequence[Datum]) -> list[tuple[float, ...]]:
    return [tuple(values_BT[row, : len(d.model_input)].tolist()) for row, d in enumerate(data)]


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
