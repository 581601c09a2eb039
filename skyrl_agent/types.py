"""Data that crosses stages: every collector, store, trainer and evaluator speaks these types.

All are frozen: a stage never edits what an earlier stage produced; it builds a new value.
Token sequences are tuples of ints so that a recorded turn cannot change after the fact.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np


class FinishReason(enum.StrEnum):
    """Why a model call or a whole trajectory ended."""

    STOP = "stop"
    """The model emitted a stop token or stop string (a turn), or the agent declared it was done."""
    LENGTH = "length"
    """The turn hit `max_tokens`."""
    CONTEXT_OVERFLOW = "context_overflow"
    """The conversation no longer fits the context window, even after summarization."""
    MAX_TURNS = "max_turns"
    """The agent used up its turn budget."""
    TOKEN_BUDGET = "token_budget"
    """The trajectory sampled its `agent.max_sampled_tokens` (a straggler stopped)."""
    AGENT_TIMEOUT = "agent_timeout"
    """The agent ran past its deadline."""
    SANDBOX_ERROR = "sandbox_error"
    """The sandbox failed to start or died under the agent."""
    ERROR = "error"
    """Any other failure (model server, agent crash); the trajectory's `mask_reason` says which."""
    ABORTED = "aborted"
    """A model call was aborted by the server (pause with mode=abort)."""


class FailureKind(enum.StrEnum):
    """Who a failed trajectory's failure belongs to; decides retry and masking (policy.py)."""

    INFRA = "infra"
    """The host's: a sandbox that would not start, an engine or model-server error. Retried,
    then masked."""
    UNSUPPORTED = "unsupported"
    """The task asks for what this backend cannot give. Masked, never retried."""
    AGENT_TIMEOUT = "agent_timeout"
    """The agent ran past its deadline. Masked."""
    AGENT_CRASH = "agent_crash"
    """The agent's own code raised. Masked."""
    SANDBOX_DIED = "sandbox_died"
    """The sandbox died while the agent's commands ran (it can kill its own). Reward 0, kept."""
    OVER_LIMIT = "over_limit"
    """What the agent left passes the artifact limits, or its processes could not be killed.
    Reward 0, kept."""


def _frozen_mapping(values: Mapping[str, float]) -> Mapping[str, float]:
    return MappingProxyType(dict(values))


TAMPERING = "tampering"
"""The typed reason (prefix) of a reward refused because the agent's work reached for the grader."""


@dataclass(frozen=True)
class Reward:
    """The verifier's verdict on one trajectory."""

    value: float
    """The scalar used for training: reward.json's `reward` key, its only key, or the mean of its
    keys."""
    components: Mapping[str, float] = field(default_factory=dict)
    """Every number the verifier wrote (reward.json keys, or {"reward": x} for reward.txt)."""
    reason: str | None = None
    """Why the reward is 0 without the tests saying so (no reward file, garbled, timeout, ...)."""
    verify_time_s: float = 0.0
    """Wall time of the verification step."""

    def __post_init__(self) -> None:
        if not math.isfinite(self.value):
            raise ValueError(f"reward must be finite, got {self.value}")
        object.__setattr__(self, "components", _frozen_mapping(self.components))

    @classmethod
    def failed(cls, reason: str, verify_time_s: float = 0.0) -> Reward:
        """A zero reward that records why no real reward could be read."""
        return cls(value=0.0, components={}, reason=reason, verify_time_s=verify_time_s)

    @classmethod
    def tampered(cls, what: str) -> Reward:
        """A zero reward for work the verifier refused to take because it reaches for the
        grader (the test runner's configuration, its plug-ins, the interpreter)."""
        return cls.failed(f"{TAMPERING}: {what}")

    @property
    def tampering(self) -> bool:
        """Whether the verifier refused the agent's work as tampering."""
        return (self.reason or "").startswith(f"{TAMPERING}:")


@dataclass(frozen=True)
class RoutedExperts:
    """The experts a mixture-of-experts model's routers chose, for consecutive token positions
    (Rollout Routing Replay: the trainer replays what the sampler chose).

    Compact: ids are unsigned integers of `width` bytes in one buffer, row-major over
    [tokens, layers, top_k]; 8 layers x top-8 over 128 experts is 64 bytes a token.
    """

    start: int
    """Position of the first row within the sequence (its turn's prompt + completion)."""
    layers: int
    """MoE layers, in the model's order."""
    top_k: int
    """Experts chosen per token and layer (sorted by the router's weight, as it chose them)."""
    ids: bytes
    """The expert ids, little-endian."""
    width: int = 1
    """Bytes per id: 1 for up to 256 experts, else 2."""

    def __post_init__(self) -> None:
        if self.width not in (1, 2) or self.start < 0 or self.layers < 1 or self.top_k < 1:
            raise ValueError(f"bad routed-experts header: start {self.start}, {self.layers} "
                             f"layers, top-{self.top_k}, {self.width}-byte ids")
        if len(self.ids) % (self.layers * self.top_k * self.width):
            raise ValueError(f"{len(self.ids)} bytes of routed experts are not whole rows of "
                             f"{self.layers} layers x top-{self.top_k}")

    @property
    def tokens(self) -> int:
        return len(self.ids) // (self.layers * self.top_k * self.width)

    @property
    def end(self) -> int:
        """The position after the last row."""
        return self.start + self.tokens

    def array(self) -> np.ndarray:
        """[tokens, layers, top_k] expert ids."""
        dtype = np.dtype("<u1" if self.width == 1 else "<u2")
        return np.frombuffer(self.ids, dtype=dtype).reshape(self.tokens, self.layers, self.top_k)

    @classmethod
    def from_array(cls, experts_TLK: np.ndarray, start: int = 0) -> RoutedExperts:
        if experts_TLK.ndim != 3:
            raise ValueError(f"routed experts are [tokens, layers, top_k], got shape "
                             f"{experts_TLK.shape}")
        if experts_TLK.size and (experts_TLK.min() < 0 or experts_TLK.max() >= 1 << 16):
            raise ValueError("expert ids must lie in [0, 65536)")
        width = 1 if not experts_TLK.size or experts_TLK.max() < 256 else 2
        data = np.ascontiguousarray(experts_TLK, dtype="<u1" if width == 1 else "<u2")
        return cls(start, experts_TLK.shape[1], experts_TLK.shape[2], data.tobytes(), width)

    def since(self, position: int) -> RoutedExperts:
        """Only the rows from `position` on."""
        skip = max(0, position - self.start)
        row = self.layers * self.top_k * self.width
        return RoutedExperts(self.start + skip, self.layers, self.top_k,
                             self.ids[skip * row:], self.width)

    def to_json(self) -> dict[str, Any]:
        """The wire form: the header and base64 ids."""
        return {"start": self.start, "layers": self.layers, "top_k": self.top_k,
                "width": self.width, "ids": base64.b64encode(self.ids).decode()}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> RoutedExperts:
        return cls(int(value["start"]), int(value["layers"]), int(value["top_k"]),
                   base64.b64decode(value["ids"], validate=True), int(value["width"]))


@dataclass(frozen=True)
class ChangedWeights:
    """Which tensors of a weights file changed since an earlier version: a server that holds
    exactly that version copies only these (an MoE step moves only the experts it routed to)."""

    since_version: int
    """The weights version the change is relative to."""
    rows: Mapping[str, tuple[int, ...] | None]
    """Tensor name -> the rows (indices along its first dimension, e.g. experts) that changed,
    or None for the whole tensor. A tensor not named did not change."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "rows", MappingProxyType(dict(self.rows)))

    def __reduce__(self) -> tuple[Any, ...]:
        # The read-only mapping cannot be pickled; Ray actors and rank processes pickle this.
        return (ChangedWeights, (self.since_version, dict(self.rows)))

    def to_json(self) -> dict[str, Any]:
        return {"since_version": self.since_version,
                "rows": {name: None if rows is None else list(rows)
                         for name, rows in self.rows.items()}}


@dataclass(frozen=True)
class PlacedImage:
    """An image inside a token sequence: its encoded bytes and the span of placeholder tokens
    (the model's image token, as many as its processor gives this image) that stand for it.
    The pixels are always recomputed from `data` by the model's own image processor, so the
    sampler and the trainer read the same input."""

    data: bytes
    """The encoded image (PNG or JPEG), exactly as the model was given it."""
    offset: int
    """Index of the first placeholder token in the sequence."""
    length: int
    """How many placeholder tokens the image occupies."""

    def __post_init__(self) -> None:
        if self.offset < 0 or self.length < 1:
            raise ValueError(f"an image spans at least one token at offset >= 0, not "
                             f"{self.length} at {self.offset}")

    @property
    def end(self) -> int:
        return self.offset + self.length

    @property
    def sha256(self) -> str:
        """The content address the store keeps the bytes under (once per trajectory)."""
        return hashlib.sha256(self.data).hexdigest()

    def shifted(self, by: int) -> PlacedImage:
        return PlacedImage(self.data, self.offset + by, self.length)


@dataclass(frozen=True)
class Turn:
    """One model call, recorded token-exactly: the ids the model saw and the ids it sampled."""

    prompt_ids: tuple[int, ...]
    """The full prompt, as token ids, exactly as sent to the server."""
    completion_ids: tuple[int, ...]
    """The ids the model sampled, as the server returned them (never re-tokenized)."""
    completion_logprobs: tuple[float, ...]
    """Log-probability of each sampled id under the sampling policy; same length as
    completion_ids."""
    loss_mask: tuple[int, ...]
    """1 for tokens trained on (sampled tokens), 0 for the rest; same length as completion_ids."""
    policy_version: int
    """Version of the weights that sampled this turn (for staleness and off-policy correction)."""
    finish_reason: FinishReason
    """Why the call ended: stop, length or aborted."""
    started_at: float = 0.0
    """Unix time when the request was sent."""
    latency_s: float = 0.0
    """Seconds from request to last token."""
    routed_experts: RoutedExperts | None = None
    """For MoE models with routing replay (R3): the experts the sampler's routers chose for the
    positions this turn added to its segment (rows `start` .. `end` of prompt + completion; the
    last sampled token has none, since the sampler never ran the model on it)."""
    token_policy_versions: tuple[int, ...] | None = None
    """Per sampled token, the weight version that sampled it (differs within a turn when
    weights were updated mid-generation); `policy_version` is the oldest of them."""
    versions_exact: bool = False
    """True when the server recomputed the turn's KV cache under the new weights at each
    update (vLLM, whose pause clears its cache), so every token was sampled by its version's
    weights alone; False (the embedded server) when tokens after an update continued on a cache
    the older weights wrote."""
    images: tuple[PlacedImage, ...] = ()
    """Vision models: every image in `prompt_ids` (earlier turns' too), over its span of
    image tokens, in order."""

    def __post_init__(self) -> None:
        n = len(self.completion_ids)
        if len(self.completion_logprobs) != n or len(self.loss_mask) != n:
            raise ValueError(
                f"turn has {n} completion ids but {len(self.completion_logprobs)} logprobs "
                f"and {len(self.loss_mask)} mask entries"
            )
        if any(image.end > len(self.prompt_ids) for image in self.images):
            raise ValueError(f"an image span runs past the {len(self.prompt_ids)} prompt ids")


@dataclass(frozen=True)
class Segment:
    """Turns that share one growing token sequence.

    Turn k+1's prompt extends turn k's prompt + completion. A new segment starts when history is
    rewritten (self-summarization), so each segment is one training sequence.
    """

    turns: tuple[Turn, ...]
    """The model calls of this segment, in order."""
    summary_turn_index: int | None = None
    """Index of the turn that produced the summary closing this segment, if it was summarized."""

    def new_inputs(self) -> list[tuple[int, ...]]:
        """Per turn, the prompt ids that the previous prompt + completion did not already hold
        (the whole prompt for the first turn): the observation the agent added."""
        inputs: list[tuple[int, ...]] = []
        history: tuple[int, ...] = ()
        for turn in self.turns:
            inputs.append(turn.prompt_ids[len(history):])
            history = turn.prompt_ids + turn.completion_ids
        return inputs

    def is_token_consistent(self) -> bool:
        """True when every turn's prompt extends the previous prompt + completion."""
        for prev, cur in zip(self.turns, self.turns[1:], strict=False):
            history = prev.prompt_ids + prev.completion_ids
            if cur.prompt_ids[: len(history)] != history:
                return False
        return True


TIME_ACCOUNT = ("sandbox", "model", "exec", "framework", "handover", "collect", "verify",
                "stop")
"""The buckets of an episode's time account (Trajectory.time_account), in the order they come."""


@dataclass(frozen=True)
class Trajectory:
    """One agent run on one task: its token-level turns, its reward and how it ended."""

    task_id: str
    """The task's name (e.g. `demo/hello-file`)."""
    sample_index: int
    """Which of the n samples of this task in its group."""
    agent: str
    """The agent's registered name."""
    segments: tuple[Segment, ...]
    """Token sequences; more than one when the context was summarized."""
    reward: Reward
    """The verifier's verdict."""
    finish_reason: FinishReason
    """How the run ended."""
    masked: bool = False
    """True when the trajectory must not contribute to the loss (infra failure, timeout, ...)."""
    mask_reason: str | None = None
    """Why it is masked."""
    failure: FailureKind | None = None
    """Whose failure it was, when the run failed (None: it ran to verification)."""
    sandbox_time_s: float = 0.0
    """Seconds to start the sandbox."""
    agent_time_s: float = 0.0
    """Seconds the agent ran."""
    verify_time_s: float = 0.0
    """Seconds the tests took, from copying them in to reading the reward."""
    model_time_s: float = 0.0
    """Seconds the agent waited on model calls: queued, prefilled, decoded, and the trip."""
    exec_time_s: float = 0.0
    """Seconds commands ran in the sandbox for the agent (tool calls, keystrokes' waits)."""
    handover_time_s: float = 0.0
    """Seconds from the agent's end to the tests but the collection: its processes killed; in
    separate mode also the wait for the verifier's sandbox (started while the agent worked)
    and the artifacts restored into it."""
    stop_time_s: float = 0.0
    """Seconds to stop the agent's sandbox."""
    total_time_s: float = 0.0
    """Wall seconds of the whole episode, sandbox start to reward."""
    collect_time_s: float = 0.0
    """Seconds collecting the agent's artifacts out of its sandbox (bounded by
    verifier.max_collect_seconds: what the agent left decides it)."""
    metrics: Mapping[str, float] = field(default_factory=dict)
    """Free-form numeric metrics (turns, summaries, drift_tokens, parse errors, ...)."""

    def __post_init__(self) -> None:
        if self.masked and not self.mask_reason:
            raise ValueError("a masked trajectory needs a mask_reason")
        object.__setattr__(self, "metrics", _frozen_mapping(self.metrics))

    @property
    def num_turns(self) -> int:
        return sum(len(s.turns) for s in self.segments)

    @property
    def framework_time_s(self) -> float:
        """The rest of the episode: the agent's own logic, rendering, parsing, the event loop
        and waits for a free sandbox or model slot outside the model calls."""
        accounted = (self.sandbox_time_s + self.model_time_s + self.exec_time_s
                     + self.handover_time_s + self.collect_time_s + self.verify_time_s
                     + self.stop_time_s)
        return max(0.0, self.total_time_s - accounted)

    def time_account(self) -> dict[str, float]:
        """Where the episode's seconds went, bucket by bucket (TIME_ACCOUNT order)."""
        return {"sandbox": self.sandbox_time_s, "model": self.model_time_s,
                "exec": self.exec_time_s, "framework": self.framework_time_s,
                "handover": self.handover_time_s, "collect": self.collect_time_s,
                "verify": self.verify_time_s,
                "stop": self.stop_time_s}


def mean_time_account(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Mean seconds per trajectory in each bucket of the time account (zeros for none)."""
    accounts = [t.time_account() for t in trajectories]
    return {bucket: sum(a[bucket] for a in accounts) / max(len(accounts), 1)
            for bucket in TIME_ACCOUNT}


@dataclass(frozen=True)
class TrajectoryGroup:
    """The n samples of one task; group-relative advantages (GRPO, RLOO) are computed within it."""

    task_id: str
    """The task all samples ran on."""
    trajectories: tuple[Trajectory, ...]
    """The samples, ordered by sample_index."""

    def __post_init__(self) -> None:
        others = {t.task_id for t in self.trajectories} - {self.task_id}
        if others:
            raise ValueError(f"group {self.task_id} holds trajectories of {sorted(others)}")

    @property
    def rewards(self) -> tuple[float, ...]:
        return tuple(t.reward.value for t in self.trajectories)
