"""Starting `skyrl-agent tinker-serve` as a real child process for the Tinker tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from skyrl_agent.inference.process import ServerProcess

CLI = str(Path(sys.executable).parent / "skyrl-agent")
SDK_ENV = {"TINKER_TELEMETRY": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@pytest.fixture(autouse=True)
def _sdk_env(monkeypatch) -> None:
    for key, value in SDK_ENV.items():
        monkeypatch.setenv(key, value)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_argv(models: list[str], data_dir: Path, port: int = 0,
                extra: list[str] | None = None) -> list[str]:
    argv = [CLI, "tinker-serve", "--port", str(port), "--data-dir", str(data_dir), *(extra or [])]
    for model in models:
        argv += ["--model", model]
    return argv


def server_key(data_dir: Path) -> str:
    """The key a server made for itself in its data dir (no --api-key given)."""
    return (data_dir / "api-key").read_text().strip()


def start_server(models: list[str], data_dir: Path, log: Path, port: int = 0,
                 extra: list[str] | None = None) -> ServerProcess:
    """A started server; its `api_key` is the one it made (read from its data dir)."""
    process = ServerProcess(server_argv(models, data_dir, port, extra),
                            env={**os.environ, **SDK_ENV}, log_path=log, startup_timeout_s=120)
    process.start()
    process.api_key = server_key(data_dir)
    return process


def spawn(models: list[str], data_dir: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    """A server we may SIGKILL (its sampler child goes with it: PR_SET_PDEATHSIG)."""
    handle = open(log, "ab")  # noqa: SIM115 - the child writes to it
    try:
        return subprocess.Popen(server_argv(models, data_dir, port), stdout=handle,
                                stderr=subprocess.STDOUT, env={**os.environ, **SDK_ENV})
    finally:
        handle.close()


def wait_healthy(port: int, timeout_s: float = 120) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/healthz", timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"no Tinker server on port {port}")
