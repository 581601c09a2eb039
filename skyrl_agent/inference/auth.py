"""Bearer keys for the servers a run starts (the embedded model server, the Tinker server).

Agents run in sandboxes that may share a network namespace with these servers, so a server that
changes state (pause, weight loads, training) must not obey whoever can reach its port. A key is
read from `Authorization: Bearer KEY` (OpenAI's and vLLM's form) or `X-API-Key: KEY` (the tinker
SDK's) and compared in constant time. Keys travel to child servers through the environment, never
the command line (any user can read another's /proc/PID/cmdline), and are written to disk only in
files only their owner can read.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from skyrl_agent.atomic import atomic_write_text

if TYPE_CHECKING:
    from aiohttp import web

API_KEY_ENV = "SKYRL_AGENT_API_KEY"
"""Protects every route of the embedded server but /health (like vLLM's VLLM_API_KEY); clients
send it to endpoints the run did not start."""
CONTROL_KEY_ENV = "SKYRL_AGENT_CONTROL_KEY"
"""Set by a run for the embedded server it starts: protects its control routes only."""


def new_key(prefix: str = "") -> str:
    """A fresh random key (256 bits)."""
    return prefix + secrets.token_urlsafe(32)


def presented_key(headers: object) -> str | None:
    """The key a request carries, if any."""
    get = getattr(headers, "get")  # noqa: B009 - aiohttp's CIMultiDictProxy and plain dicts
    scheme, _, token = (get("Authorization") or "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return str(token.strip())
    key = get("X-API-Key")
    return str(key) if key else None


def key_matches(presented: str | None, expected: str) -> bool:
    """Constant-time comparison, so response times do not leak the key byte by byte."""
    return presented is not None and hmac.compare_digest(presented.encode(), expected.encode())


def unauthorized(message: str) -> web.Response:
    from aiohttp import web

    body = {"error": {"message": message, "type": "AuthenticationError", "param": None,
                      "code": 401}, "detail": message}
    return web.json_response(body, status=401, headers={"WWW-Authenticate": "Bearer"})


def write_key_file(path: Path, text: str) -> Path:
    """Write `text` to `path`, readable by its owner only from the moment it exists (the name is
    replaced atomically, so a reader never sees a partial key, and a planted link is replaced,
    never followed)."""
    return atomic_write_text(path, text, mode=0o600)


class KeyFileError(ValueError):
    """A key file that cannot be trusted."""


def read_key_file(path: Path) -> str | None:
    """The key in a file written by write_key_file, None if there is none. A file someone else
    could have written or read (a link, another owner, group or world access) is refused."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise KeyFileError(f"cannot read the key file {path}: {exc.strerror}") from None
    with os.fdopen(fd) as file:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise KeyFileError(f"refusing the key file {path}: it must belong to this user "
                               "with mode 0600")
        return file.read().strip() or None


SERVER_KEYS_FILE = "server-keys.json"
"""In a run dir: the control key of each model server the run started, by URL (mode 0600)."""


def endpoint_key() -> str | None:
    """The key for a model server the run did not start (SKYRL_AGENT_API_KEY), if set."""
    return os.environ.get(API_KEY_ENV) or None


def save_server_keys(run_dir: Path, urls: Sequence[str], keys: Sequence[str | None]) -> Path:
    """Keep the run's server keys where only their owner can read them (for tools that drive
    the servers by hand); config.json, logs and metrics never hold them."""
    table = {url: key for url, key in zip(urls, keys, strict=True) if key}
    return write_key_file(Path(run_dir) / SERVER_KEYS_FILE, json.dumps(table, indent=1) + "\n")
