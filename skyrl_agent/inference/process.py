"""Starting an inference server as a child process and waiting until it answers.

Used for the embedded server (`python -m skyrl_agent.inference.server`) and for `vllm serve`.
The child dies with its parent (PR_SET_PDEATHSIG), so a killed run never leaves a server
holding memory behind.
"""

from __future__ import annotations

import ctypes
import http.client
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from skyrl_agent.errors import UserError
from skyrl_agent.inference.auth import API_KEY_ENV, CONTROL_KEY_ENV, new_key

_PR_SET_PDEATHSIG = 1


class ServerStartError(UserError):
    """The server process exited or stayed silent before it was ready."""


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class ServerProcess:
    """A server child process. `start()` returns once it printed its ready line (or /health)."""

    def __init__(self, argv: Sequence[str], *, env: dict[str, str] | None = None,
                 log_path: Path | None = None, startup_timeout_s: float = 600.0,
                 url: str | None = None, api_key: str | None = None) -> None:
        self.argv = list(argv)
        self.api_key = api_key
        """What clients send as `Authorization: Bearer` (None: the server wants none)."""
        self.env = env
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="skyrl-server-", suffix=".log")
            os.close(fd)
            log_path = Path(name)
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.url = url
        """Known in advance for servers that print no ready line (vLLM); else read from stdout."""
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> str:
        self.spawn()
        return self.wait_ready()

    def spawn(self) -> None:
        """Start the process without waiting for it to be ready. It dies with the thread that
        spawns it (PR_SET_PDEATHSIG follows the thread), so spawn from a long-lived one."""
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps writing to it
        self._process = subprocess.Popen(
            self.argv, stdout=subprocess.PIPE, stderr=log, env=self.env,
            preexec_fn=_die_with_parent, start_new_session=True)
        log.close()

    def wait_ready(self) -> str:
        """Wait for the spawned process's ready line; its URL."""
        try:
            self.url = self._wait_ready()
        except BaseException:
            self.stop()
            raise
        # Keep draining stdout into the log: a full pipe would block the server's writes.
        threading.Thread(target=self._drain_stdout, daemon=True).start()
        return self.url

    def _drain_stdout(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        with open(self.log_path, "ab") as log:
            for line in self._process.stdout:
                log.write(line)
                log.flush()

    def _wait_ready(self) -> str:
        assert self._process is not None and self._process.stdout is not None
        deadline = time.monotonic() + self.startup_timeout_s
        with selectors.DefaultSelector() as selector:
            selector.register(self._process.stdout, selectors.EVENT_READ)
            return self._read_ready_line(selector, deadline)

    def _read_ready_line(self, selector: selectors.BaseSelector, deadline: float) -> str:
        assert self._process is not None and self._process.stdout is not None
        buffer = b""
        while time.monotonic() < deadline:
            if self.url and _healthy(self.url):
                return self.url
            if self._process.poll() is not None:
                raise ServerStartError(f"server exited with code {self._process.returncode}: "
                                       f"{self._log_tail()}")
            if selector.select(timeout=0.5):
                chunk = os.read(self._process.stdout.fileno(), 65536)
                buffer += chunk
                for line in buffer.splitlines():
                    url = _ready_url(line)
                    if url:
                        return url
        raise ServerStartError(f"server not ready after {self.startup_timeout_s:.0f} s: "
                               f"{self._log_tail()}")

    def _log_tail(self) -> str:
        lines = [ln for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        errors = [ln for ln in lines if "error" in ln.lower()]
        return (errors or lines or ["(no output)"])[-1].strip()

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int:
        """The server's process id (started servers only)."""
        if self._process is None:
            raise RuntimeError("the server was not started")
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        """The exit status once the process ended (negative: killed by that signal)."""
        return None if self._process is None else self._process.poll()

    def stop(self, timeout_s: float = 15.0) -> None:
        if self._process is None or self._process.poll() is not None:
            return
        os.killpg(self._process.pid, signal.SIGTERM)
        try:
            self._process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait()

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _ready_url(line: bytes) -> str | None:
    try:
        event = json.loads(line)
    except ValueError:
        return None
    if isinstance(event, dict) and event.get("event") == "ready":
        return str(event["url"])
    return None


def _healthy(url: str) -> bool:
    """Whether GET /health answers 200 at `url` (http://HOST:PORT or unix:SOCKET)."""
    socket_path = unix_socket_of(url)
    connection = (_UnixConnection(socket_path) if socket_path
                  else http.client.HTTPConnection(url.removeprefix("http://"), timeout=2))
    try:
        connection.request("GET", "/health")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


def unix_socket_of(url: str) -> str | None:
    """The socket path of a `unix:PATH` server URL, None for an HTTP one."""
    return url.removeprefix("unix:") if url.startswith("unix:") else None


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, socket_path: str) -> None:
        super().__init__("localhost", timeout=2)
        self.socket_path = socket_path

    def connect(self) -> None:
        import socket

        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(2)
        self.sock.connect(self.socket_path)


MALLOC_MMAP_THRESHOLD = 128 * 1024
"""Bytes from which the embedded server's allocations are mapped (and unmapped when freed)."""


def embedded_server(model: str = "smollm2-135m", *, max_batch_size: int = 32,
                    kv_cache_mb: float | None = None,
                    max_model_len: int | None = None, served_model_name: str | None = None,
                    log_path: Path | None = None,
                    weights_dirs: Sequence[Path] = (), dtype: str = "float32") -> ServerProcess:
    """A ServerProcess for the embedded server on a free port of 127.0.0.1, with a fresh key
    for its control routes (`api_key`; generation stays open). It loads weights from the
    trainer's shared-memory files and from `weights_dirs`."""
    argv = [sys.executable, "-m", "skyrl_agent.inference.server", "--model", model,
            "--port", "0", "--max-batch-size", str(max_batch_size), "--dtype", dtype]
    if kv_cache_mb is not None:
        argv += ["--kv-cache-mb", str(kv_cache_mb)]
    if max_model_len:
        argv += ["--max-model-len", str(max_model_len)]
    if served_model_name:
        argv += ["--served-model-name", served_model_name]
    for folder in weights_dirs:
        argv += ["--weights-dir", str(folder)]
    key = new_key()
    env = {name: value for name, value in os.environ.items() if name != API_KEY_ENV}
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", CONTROL_KEY_ENV: key})
    # glibc raises its mmap threshold after each large free, so later KV buffers come from the
    # heap, whose freed memory stays resident: a fixed threshold hands it back (peak RSS under
    # 64 sessions 3.5 GB -> 2.4 GB, benchmarks/server_memory.py).
    env.setdefault("MALLOC_MMAP_THRESHOLD_", str(MALLOC_MMAP_THRESHOLD))
    env.setdefault("MALLOC_TRIM_THRESHOLD_", str(MALLOC_MMAP_THRESHOLD))
    return ServerProcess(argv, env=env, log_path=log_path, api_key=key)
