"""Shared fixtures: sandbox backends, the Docker and GPU tier guards (SKYRL_AGENT_REQUIRE_DOCKER=1
or SKYRL_AGENT_REQUIRE_GPU=1 make a tier run or fail, never skip), models."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from skyrl_agent.config import SandboxConfig

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "tasks" / "demo"
BASE_IMAGE = "skyrl-agent/base:bookworm"


def _docker_ready() -> str | None:
    """None when the engine answers and the base image exists, else why not."""
    if shutil.which("docker") is None:
        return "docker client not installed"
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        return "no Docker engine running"
    if subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True).returncode:
        return f"base image {BASE_IMAGE} missing (scripts/build-base-image.sh)"
    return None


def _guard_tier(items, marker: str, why: str | None, require_variable: str) -> None:
    """Skip the tier's tests when it cannot run, unless the variable says it must (then the
    run stops with the reason, so a tier never passes by skipping)."""
    if why is None:
        return
    if os.environ.get(require_variable) == "1":
        raise pytest.UsageError(f"the {marker} tier must run here but: {why}")
    for item in items:
        if marker in item.keywords:
            item.add_marker(pytest.mark.skip(reason=why))


def pytest_collection_modifyitems(config, items):
    from skyrl_agent.inference.vllm import vllm_available

    if any("docker" in item.keywords for item in items):
        _guard_tier(items, "docker", _docker_ready(), "SKYRL_AGENT_REQUIRE_DOCKER")
    if any("gpu" in item.keywords for item in items):
        _guard_tier(items, "gpu", vllm_available(), "SKYRL_AGENT_REQUIRE_GPU")


@pytest.fixture(params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def backend(request) -> str:
    return request.param


@pytest.fixture
def sandbox_config(backend) -> SandboxConfig:
    return SandboxConfig(backend=backend)


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The built-in SmolLM2-135M-Instruct folder (converted once into the cache)."""
    from skyrl_agent.inference.models import resolve_model
    return resolve_model("smollm2-135m")


@pytest.fixture(scope="session")
def tiny_model_dir(smollm2_dir, tmp_path_factory) -> Path:
    """A randomly initialized 2-layer Llama with SmolLM2's tokenizer: real code paths, < 1 s."""
    from tests.tiny_models import tiny_llama_dir

    return tiny_llama_dir(tmp_path_factory.mktemp("tiny-llama"), smollm2_dir)


@pytest.fixture
def work_root():
    """A folder for `sandbox.work_root` that the unprivileged sandbox user can reach (pytest's
    tmp_path is private to root)."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="skyrl-test-root-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def fsynced(monkeypatch) -> list[str]:
    """The paths passed to os.fsync from now on, in order (what a power loss would keep)."""
    synced: list[str] = []
    real = os.fsync

    def recording(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", recording)
    return synced
