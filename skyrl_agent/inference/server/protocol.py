"""Request bodies of the embedded server, with OpenAI's and vLLM's field names.

Unknown fields are rejected (400) rather than ignored, so a client never believes a setting took
effect when it did not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from skyrl_agent.inference.bounds import (
    MAX_LOGPROBS,
    MAX_MESSAGES,
    MAX_N,
    MAX_PROMPT_CHARS,
    MAX_PROMPT_CHUNKS,
    MAX_SEQUENCES,
    MAX_TOOLS,
    check_stop,
    check_stop_ids,
)
from skyrl_agent.inference.server.sampling import SamplingParams

MAX_SEED = 2**63 - 1
"""Seeds torch's generators take (sample i of n uses seed + i, which stays below 2**64)."""


@dataclass(frozen=True)
class RequestLimits:
    """What one request may ask of the server, so that no single request (from anyone who can
    reach the port) holds the CPU or memory for long."""

    max_sequences: int = MAX_SEQUENCES
    """Prompts x n of one request (a request is batched as a whole)."""
    max_prompt_chars: int = MAX_PROMPT_CHARS
    """Characters of text to tokenize (a prompt, or rendered chat messages): tokenizing costs
    about 70 bytes of memory per character."""


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Sampling(_Body):
    """Fields shared by completions and chat completions."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0, le=10)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=-1)
    """vLLM's extension; 0 or -1 = off."""
    n: int = Field(default=1, ge=1, le=MAX_N)
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    return_token_ids: bool = False
    """vLLM's flag: also return `prompt_token_ids` and each choice's `token_ids`."""
    stream: bool = False
    user: str | None = None

    @field_validator("stream")
    @classmethod
    def _no_stream(cls, value: bool) -> bool:
        if value:
            raise ValueError("streaming is not supported by the embedded server; use stream=false")
        return value

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        check_stop(value)  # each is looked for after every sampled token
        return value

    @field_validator("stop_token_ids")
    @classmethod
    def _few_stop_ids(cls, value: list[int] | None) -> list[int] | None:
        check_stop_ids(value)
        return value

    def sampling(self, max_tokens: int, logprobs: int | None) -> SamplingParams:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return SamplingParams(
            max_tokens=max_tokens, temperature=self.temperature, top_p=self.top_p,
            top_k=max(self.top_k, 0), seed=self.seed, stop=stop,
            stop_token_ids=tuple(self.stop_token_ids or ()), ignore_eos=self.ignore_eos,
            logprobs=logprobs)


class TokenChunk(_Body):
    """Part of a prompt given as token ids."""

    type: Literal["encoded_text"] = "encoded_text"
    tokens: list[int] = Field(min_length=1)


class ImageChunk(_Body):
    """An image in a prompt: it takes as many image tokens as the model's processor gives it."""

    type: Literal["image"] = "image"
    data: str
    """Base64 bytes (PNG or JPEG), or a data: URL."""
    expected_tokens: int | None = Field(default=None, ge=1)
    """When given, a request whose image takes another number of tokens is refused."""


class CompletionRequest(_Sampling):
    """POST /v1/completions."""

    prompt: str | list[int] | list[str] | list[list[int]] | None = None
    """Text, token ids, or a list of either (one prompt each)."""
    prompt_chunks: list[Annotated[TokenChunk | ImageChunk, Field(discriminator="type")]] | None \
        = Field(default=None, min_length=1, max_length=MAX_PROMPT_CHUNKS)
    """Vision models: one prompt as token and image chunks in order (Tinker's ModelInput
    layout); the tokens around each image (e.g. image start/end markers) are the caller's."""
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    """Top alternatives per token; 0 still returns the sampled token's logprob."""
    echo: bool = False
    return_routed_experts: bool = False
    """MoE models: each choice also carries `routed_experts`, the experts every router chose
    for each position the model ran on (prompt, then sampled tokens but the last), packed
    (see skyrl_agent.types.RoutedExperts) for Rollout Routing Replay."""

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value: bool) -> bool:
        if value:
            raise ValueError("echo is not supported; return_token_ids returns the prompt ids")
        return value

    @field_validator("prompt")
    @classmethod
    def _not_empty(cls, value: Any) -> Any:
        if isinstance(value, list) and not value:
            raise ValueError("prompt is empty")
        return value

    @model_validator(mode="after")
    def _one_prompt_form(self) -> CompletionRequest:
        if (self.prompt is None) == (self.prompt_chunks is None):
            raise ValueError("give exactly one of prompt or prompt_chunks")
        return self

    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: text or token ids (not for prompt_chunks)."""
        assert self.prompt is not None
        if isinstance(self.prompt, str):
            return [self.prompt]
        if all(isinstance(p, int) for p in self.prompt):
            return [list(self.prompt)]  # type: ignore[arg-type]
        return list(self.prompt)  # type: ignore[arg-type]


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions. Tool definitions go to the chat template unchanged."""

    messages: list[dict[str, Any]] = Field(min_length=1, max_length=MAX_MESSAGES)
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: str | dict[str, Any] | None = None
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("messages")
    @classmethod
    def _roles(cls, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, message in enumerate(messages):
            if "role" not in message:
                raise ValueError(f"messages[{i}] has no role")
        return messages

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def logprob_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class TokenizeRequest(_Body):
    """POST /tokenize: text, or chat messages rendered with the chat template."""

    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = Field(default=None, max_length=MAX_MESSAGES)
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=MAX_TOOLS)
    add_generation_prompt: bool = True
    add_special_tokens: bool = False
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt or messages")
        return self


class DetokenizeRequest(_Body):
    """POST /detokenize."""

    model: str | None = None
    tokens: list[int]


class ChangedTensors(_Body):
    """The tensors of the file that changed since `since_version` (see types.ChangedWeights)."""

    since_version: int = Field(ge=0)
    rows: dict[str, list[int] | None]


class UpdateWeightsRequest(_Body):
    """POST /update_weights: a safetensors file written by the trainer, and its version."""

    path: str
    version: int = Field(ge=0)
    changed: ChangedTensors | None = None
    """Only these tensors (rows) changed since `since_version`: a server holding that version
    copies them alone; any other server copies the whole file."""
