"""Futures: every mutating call answers with a request id at once, and the client long-polls
`retrieve_future` until the result is there.

A result is kept for `keep_s` after it finished (a client whose poll reply was lost polls
again), then dropped; an id this server does not know answers 410, which tells the SDK to send
the original request again (what it does after a server restart).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Literal

from skyrl_agent.tinker.errors import TinkerUserError

Category = Literal["user", "server"]


@dataclass(frozen=True)
class Result:
    """A finished request: a protobuf or JSON payload, or an error."""

    proto: bytes | None = None
    """Serialized protobuf (ForwardBackwardOutput, SampleResponse)."""
    json: object = None
    error: str | None = None
    category: Category = "server"


@dataclass
class _Entry:
    kind: str
    owner: str
    """The tenant that sent the request: the only one that may read its result (ids are
    random, but one may be seen: a sequence id carries its request's)."""
    done: asyncio.Event = field(default_factory=asyncio.Event)
    result: Result | None = None
    finished_at: float = 0.0


class FutureStore:
    """Request ids, their results, and waiting for them."""

    def __init__(self, keep_s: float = 900.0) -> None:
        self.keep_s = keep_s
        self._entries: dict[str, _Entry] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def submit(self, kind: str, work: Awaitable[Result], owner: str) -> str:
        """Start `owner`'s `work` in the background; returns its request id."""
        self._expire()
        request_id = secrets.token_hex(16)
        entry = _Entry(kind, owner)
        self._entries[request_id] = entry
        task = asyncio.get_running_loop().create_task(self._settle(entry, work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return request_id

    async def wait(self, request_id: str, timeout_s: float, owner: str) -> Result | None:
        """The result, or None if it is still running after `timeout_s`.
        KeyError: the id is unknown (expired, from before a restart, or another tenant's)."""
        entry = self._entries[request_id]
        if entry.owner != owner:
            raise KeyError(request_id)
        if not entry.done.is_set():
            try:
                await asyncio.wait_for(entry.done.wait(), timeout_s)
            except TimeoutError:
                return None
        return entry.result

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _settle(self, entry: _Entry, work: Awaitable[Result]) -> None:
        try:
            entry.result = await work
        except TinkerUserError as exc:
            entry.result = Result(error=str(exc), category="user")
        except asyncio.CancelledError:
            entry.result = Result(error="the server is shutting down", category="server")
            raise
        except Exception as exc:  # noqa: BLE001 - any failure becomes the future's error
            entry.result = Result(error=f"{type(exc).__name__}: {exc}", category="server")
        finally:
            entry.finished_at = time.monotonic()
            entry.done.set()

    def _expire(self) -> None:
        cutoff = time.monotonic() - self.keep_s
        stale = [key for key, e in self._entries.items()
                 if e.done.is_set() and e.finished_at < cutoff]
        for key in stale:
            del self._entries[key]
