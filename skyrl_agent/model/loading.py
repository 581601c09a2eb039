"""The model a torch backend trains: loaded from the folder the inference server serves, with
optional LoRA adapters (peft), and exported back in the server's parameter names."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoraSettings:
    """LoRA adapters instead of full fine-tuning (Hu et al. 2021)."""

    rank: int
    alpha: int = 32
    target_modules: tuple[str, ...] = field(
        default=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))
    """Linear layers (by name suffix) that get adapters."""
    expert_parameters: tuple[str, ...] = ("gate_up_proj", "down_proj")
    """MoE models: the experts' stacked [experts, out, in] weights (by parameter name) that get
    adapters, one low-rank pair per expert (peft's `target_parameters`)."""


def pick_device(device: str | None = None) -> torch.device:
    """CUDA when visible, else CPU."""
    if device:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """`auto`: bfloat16 on a GPU that supports it, float32 otherwise (CPU bf16 matmuls are slow
    and would drift from a float32 server)."""
    if dtype == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    resolved = getattr(torch, dtype, None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r} (auto, float32 or bfloat16)")
    return resolved


def load_causal_lm(folder: Path, dtype: torch.dtype, device: torch.device,
                   lora: LoraSettings | None, frozen_base: Any = None) -> Any:
    """The HF causal LM in `folder`, in eval mode (no dropout: the sampler has none either).
    With `frozen_base` (that model, loaded once; LoRA only) the new model's base weights are
    its tensors, not copies: several adapters train over one base in memory."""
    from transformers.utils import logging as hf_logging

    from skyrl_agent.model.vision import is_vision_model, load_pretrained

    hf_logging.disable_progress_bar()  # our own progress display owns the terminal
    model: Any
    if frozen_base is not None:
        if lora is None:
            raise ValueError("only LoRA models can share a frozen base")
        model = sharing_copy(frozen_base)
    else:
        model = load_pretrained(folder, dtype)
        model.to(device)
    model.eval()
    if lora is not None:
        from peft import LoraConfig, get_peft_model

        targets: list[str] | str = list(lora.target_modules)
        if is_vision_model(folder):  # adapters on the language model, not the vision tower
            targets = rf".*language_model\..*\.({'|'.join(lora.target_modules)})"
        config = LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=0.0,
                            target_modules=targets, bias="none",
                            target_parameters=expert_targets(model, lora) or None)
        model = get_peft_model(model, config)
        model.eval()
    return model


def sharing_copy(model: Any) -> Any:
    """A copy of `model`'s modules that holds `model`'s own parameter tensors (deepcopy's memo
    maps each to itself), so it costs no weight memory; LoRA then freezes them in both."""
    import copy

    return copy.deepcopy(model, {id(p): p for p in model.parameters()})


def trainable_parameters(model: Any) -> dict[str, torch.nn.Parameter]:
    """What the optimizer updates and checkpoints hold: every parameter, or only the adapters."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def expert_targets(model: Any, lora: LoraSettings) -> list[str]:
    """`experts.<name>` for each of `lora.expert_parameters` the model's MoE layers hold."""
    held = {name.rsplit(".", 1)[-1] for name, _ in model.named_parameters()
            if ".experts." in name}
    return [f"experts.{name}" for name in lora.expert_parameters if name in held]


def lora_layers(model: Any) -> dict[str, Any]:
    """The model's LoRA-wrapped layers by the server's weight name (`...q_proj.weight`, or
    `...mlp.experts.gate_up_proj` for an adapted expert weight)."""
    from peft.tuners.lora import LoraLayer, ParamWrapper

    layers = {}
    for name, module in model.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        # Adapted expert weights nest: experts -> wrapper(down_proj) -> wrapper(gate_up_proj).
        path = name.removeprefix("base_model.model.").replace(".base_layer", "")
        weight = module.parameter_name if isinstance(module, ParamWrapper) else "weight"
        layers[f"{path}.{weight}"] = module
    return layers


def base_weight(layer: Any) -> torch.Tensor:
    """The frozen weight a LoRA layer adapts."""
    return getattr(layer.get_base_layer(), getattr(layer, "parameter_name", None) or "weight")


def merged_lora_weights(model: Any) -> dict[str, torch.Tensor]:
    """Base weight + the adapter's delta, for every adapted layer: what a server without LoRA
    support serves. Computed fresh, so the trained model itself is never merged in place."""
    with torch.no_grad():
        return {name: base_weight(layer) + layer.get_delta_weight("default")
                for name, layer in lora_layers(model).items()}


def save_adapter(model: Any, folder: Path) -> None:
    """The model's LoRA adapters as a PEFT adapter folder (rewritten in place)."""
    model.save_pretrained(folder, safe_serialization=True)


def server_parameters(model: Any) -> dict[str, torch.Tensor]:
    """A full model's parameters by the server's names (tied weights appear once)."""
    return dict(model.named_parameters())


def export_model(model: Any, source: Path, target: Path) -> None:
    """A folder `serve --model` loads: the weights (adapters merged) and the source's tokenizer."""
    from transformers import AutoTokenizer

    if hasattr(model, "merge_and_unload"):
        import copy

        model = copy.deepcopy(model).merge_and_unload()
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(source).save_pretrained(target)
