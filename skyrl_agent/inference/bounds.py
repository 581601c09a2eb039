"""What one request may carry, for every server that takes requests from outside the run: the
embedded model server, the capture proxy and the Tinker server.

Anyone with a key (and, through the capture proxy, the agent under training) writes these
fields, so each is bounded where a bigger value would cost the server more than the request's
own share: stop strings and ids are checked after every sampled token, n and prompts multiply
the sequences in a batch, images are decoded, metadata is stored. One request past a bound is
refused with HTTP 400 and one line naming it. `docs/threat-model.md` has the table (field,
bound, where it is enforced); `benchmarks/request_bounds.py` measures a request beside one at
every bound.
"""

from __future__ import annotations

from collections.abc import Sequence

from skyrl_agent.model.vision import MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS, MAX_IMAGES

__all__ = ["MAX_IMAGES", "MAX_IMAGE_BYTES", "MAX_IMAGE_PIXELS"]

MAX_STOP_STRINGS = 16
"""Stop strings of one request: each is searched for in the decoded tail after every token."""
MAX_STOP_CHARS = 256
"""Characters of one stop string: the tail decoded after every token is this long."""
MAX_STOP_TOKEN_IDS = 64
"""Stop token ids of one request (2.5 M of them made an 8-token request beside it 5-11x
slower)."""
MAX_N = 64
"""Samples of one prompt (`n`; Tinker's `num_samples`)."""
MAX_LOGPROBS = 20
"""Top alternatives returned per sampled token (`logprobs`, `top_logprobs`)."""
MAX_TOPK_PROMPT_LOGPROBS = 100
"""Tinker: top alternatives per prompt position (`topk_prompt_logprobs`)."""
MAX_SEQUENCES = 256
"""Prompts x n of one request (a request is batched as a whole); the embedded server's
default, `RequestLimits.max_sequences`."""
MAX_PROMPT_CHARS = 1 << 20
"""Characters of text to tokenize (a prompt, or rendered chat messages): tokenizing costs about
70 bytes of memory per character."""
MAX_MESSAGES = 4096
"""Chat messages of one request."""
MAX_TOOLS = 256
"""Tool definitions of one request."""
MAX_PROMPT_CHUNKS = 2 * MAX_IMAGES + 1
"""Token and image chunks of one prompt: text around each of at most MAX_IMAGES images."""
MAX_METADATA_ENTRIES = 64
"""Tinker: entries of a session's `user_metadata` (kept on disk with the session)."""
MAX_METADATA_CHARS = 1024
"""Tinker: characters of one metadata key or value."""
MAX_TTL_SECONDS = 10 * 365 * 24 * 3600
"""Tinker: a checkpoint's lifetime (Tinker's own limit is 10 years)."""


def check_stop(stop: str | Sequence[str] | None) -> None:
    """ValueError unless `stop` is at most MAX_STOP_STRINGS strings of MAX_STOP_CHARS."""
    strings = [stop] if isinstance(stop, str) else list(stop or ())
    if len(strings) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_CHARS for s in strings):
        raise ValueError(
            f"at most {MAX_STOP_STRINGS} stop strings of at most {MAX_STOP_CHARS} "
            f"characters each (got {len(strings)}, the longest "
            f"{max(map(len, strings))})"
        )


def check_stop_ids(ids: Sequence[int] | None) -> None:
    """ValueError unless `ids` holds at most MAX_STOP_TOKEN_IDS ids."""
    if ids is not None and len(ids) > MAX_STOP_TOKEN_IDS:
        raise ValueError(f"at most {MAX_STOP_TOKEN_IDS} stop_token_ids (got {len(ids)})")
