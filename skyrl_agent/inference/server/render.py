"""Turning engine outputs into OpenAI/vLLM response JSON, and chat messages into prompt ids."""

from __future__ import annotations

import time
import uuid
from typing import Any

from skyrl_agent.inference.server.outputs import SequenceOutput
from skyrl_agent.types import RoutedExperts


class BadRequest(ValueError):
    """Input the server refuses with a 400 and this message."""


def chat_text(renderer: Any, messages: list[dict[str, Any]],
              tools: list[dict[str, Any]] | None, add_generation_prompt: bool,
              continue_final_message: bool = False,
              template_kwargs: dict[str, Any] | None = None,
              max_chars: int | None = None) -> str:
    """Render messages (and tool definitions) with the chat template of `renderer` (a
    tokenizer, or a vision model's processor); more than `max_chars` of rendered text is
    refused before it is tokenized."""
    if not getattr(renderer, "chat_template", None):
        raise BadRequest("this model has no chat template; use /v1/completions")
    try:
        text = renderer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, **(template_kwargs or {}))
    except Exception as exc:  # noqa: BLE001 - jinja raises many types for bad messages
        raise BadRequest(f"cannot render messages with the chat template: {exc}") from None
    check_text_size(text, max_chars)
    return str(text)


def chat_prompt_ids(tokenizer: Any, messages: list[dict[str, Any]],
                    tools: list[dict[str, Any]] | None, add_generation_prompt: bool,
                    continue_final_message: bool = False,
                    template_kwargs: dict[str, Any] | None = None,
                    max_chars: int | None = None) -> list[int]:
    """Chat messages as prompt ids (see chat_text)."""
    text = chat_text(tokenizer, messages, tools, add_generation_prompt, continue_final_message,
                     template_kwargs, max_chars)
    # The template writes special tokens as text, so they must not be added a second time.
    return tokenizer.encode(text, add_special_tokens=False)


def check_text_size(text: str, max_chars: int | None) -> None:
    if max_chars is not None and len(text) > max_chars:
        raise BadRequest(f"the text to tokenize has {len(text)} characters; this server takes "
                         f"at most {max_chars}")


def _token_strings(tokenizer: Any, ids: tuple[int, ...]) -> list[str]:
    return [tokenizer.decode([i]) for i in ids]


def completion_logprobs(tokenizer: Any, out: SequenceOutput) -> dict[str, Any]:
    """The legacy completions format: tokens, token_logprobs, top_logprobs, text_offset."""
    tokens = _token_strings(tokenizer, out.token_ids)
    offsets, position = [], 0
    for token in tokens:
        offsets.append(position)
        position += len(token)
    tops = [{tokenizer.decode([i]): lp for i, lp in top} for top in out.top_logprobs]
    return {"tokens": tokens, "token_logprobs": list(out.logprobs),
            "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(tokenizer: Any, out: SequenceOutput) -> dict[str, Any]:
    """The chat format: one entry per token with its bytes and top alternatives."""
    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        token = tokenizer.decode([token_id])
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

    content = []
    for token_id, logprob, top in zip(out.token_ids, out.logprobs, out.top_logprobs, strict=True):
        content.append({**entry(token_id, logprob),
                        "top_logprobs": [entry(i, lp) for i, lp in top]})
    return {"content": content}


def _versions(out: SequenceOutput, current: int, with_tokens: bool) -> dict[str, Any]:
    # The oldest version is the one that matters for staleness bounds.
    fields: dict[str, Any] = {"policy_version": min(out.policy_versions, default=current)}
    if with_tokens:
        fields["token_policy_versions"] = list(out.policy_versions)
    return fields


def usage(prompt_tokens: int, outputs: list[SequenceOutput]) -> dict[str, Any]:
    completion = sum(len(o.token_ids) for o in outputs)
    cached = max((o.cached_prompt_tokens for o in outputs), default=0)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def completion_response(model: str, tokenizer: Any, prompts: list[list[int]],
                        results: list[list[SequenceOutput]], with_ids: bool,
                        with_logprobs: bool, version: int,
                        with_routing: bool = False) -> dict[str, Any]:
    choices: list[dict[str, Any]] = []
    for prompt, outputs in zip(prompts, results, strict=True):
        for out in outputs:
            choice: dict[str, Any] = {
                "index": len(choices), "text": out.text, "finish_reason": out.finish_reason,
                "stop_reason": None,
                "logprobs": completion_logprobs(tokenizer, out) if with_logprobs else None,
                **_versions(out, version, with_ids)}
            if with_ids:
                choice["prompt_token_ids"] = prompt
                choice["token_ids"] = list(out.token_ids)
            if with_routing and out.routed_experts is not None:
                choice["routed_experts"] = RoutedExperts.from_array(out.routed_experts).to_json()
            choices.append(choice)
    all_outputs = [o for outputs in results for o in outputs]
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
            "created": int(time.time()), "model": model, "choices": choices,
            "usage": usage(sum(len(p) for p in prompts), all_outputs)}


def chat_response(model: str, tokenizer: Any, prompt: list[int], outputs: list[SequenceOutput],
                  with_ids: bool, with_logprobs: bool, version: int) -> dict[str, Any]:
    choices = []
    for index, out in enumerate(outputs):
        choice: dict[str, Any] = {
            "index": index, "message": {"role": "assistant", "content": out.text},
            "finish_reason": out.finish_reason, "stop_reason": None,
            "logprobs": chat_logprobs(tokenizer, out) if with_logprobs else None,
            **_versions(out, version, with_ids)}
        if with_ids:
            choice["token_ids"] = list(out.token_ids)
        choices.append(choice)
    body: dict[str, Any] = {
        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
        "created": int(time.time()), "model": model, "choices": choices,
        "usage": usage(len(prompt), outputs)}
    if with_ids:
        body["prompt_token_ids"] = prompt
    return body
