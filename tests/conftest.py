"""Shared fixtures: sandbox backends, the Docker, vLLM and GPU tier guards
(SKYRL_AGENT_REQUIRE_DOCKER=1, SKYRL_AGENT_REQUIRE_VLLM=1 or SKYRL_AGENT_REQUIRE_GPU=1 make a tier
run or fail, never skip), models, and the machine shared by parallel workers (tests marked
`serial` run alone)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
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


LONGEST_FILES = ("test_harbor", "test_sharded_backends", "test_harbor_installed_agents",
                 "test_learning", "test_tinker_cookbook", "test_train", "test_vision",
                 "test_ray_cluster", "test_vllm", "test_vllm_lora", "test_inference_server",
                 "test_swe_mini", "test_ray", "test_audit", "test_rollout_job",
                 "test_swe_challenge", "test_tinker", "test_recipe", "test_attacks",
                 "test_agents_e2e", "test_sandbox_security", "test_families_check", "test_estimate",
                 "test_harbor_relay", "test_demos", "test_tinker_restart", "test_host_limits",
                 "test_certain_kill", "test_eval", "test_inference_client", "test_moe",
                 "test_summary_training", "test_cli", "test_check_demo", "test_vllm_moe",
                 "test_swe_rollout", "test_docs", "test_impossible_twins", "test_capture",
                 "test_sft")
"""Files that take 30 s or more, longest first (measured with --junitxml in a full run of
scripts/test.sh), handed to parallel workers first so no long file starts last and leaves the
other worker idle."""


def _longest_first(item) -> int:
    name = item.path.stem
    return LONGEST_FILES.index(name) if name in LONGEST_FILES else len(LONGEST_FILES)


def _gpu_ready() -> str | None:
    import torch

    return None if torch.cuda.is_available() else "no CUDA GPU is visible"


def pytest_collection_modifyitems(config, items):
    from skyrl_agent.inference.vllm.launch import vllm_available

    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=_longest_first)  # stable: the order within a file is kept

    if any("docker" in item.keywords for item in items):
        _guard_tier(items, "docker", _docker_ready(), "SKYRL_AGENT_REQUIRE_DOCKER")
    if any("vllm" in item.keywords for item in items):
        _guard_tier(items, "vllm", vllm_available(), "SKYRL_AGENT_REQUIRE_VLLM")
    if any("gpu" in item.keywords for item in items):
        _guard_tier(items, "gpu", _gpu_ready(), "SKYRL_AGENT_REQUIRE_GPU")


@contextlib.contextmanager
def _share_of_the_machine(item) -> Iterator[None]:
    """Under pytest-xdist: a `serial` test holds the machine alone, every other test shares it.

    Two file locks in the run's base temp folder, common to its workers: the room (shared by
    ordinary tests, exclusive for a serial one) and a turnstile taken before the room, so a
    waiting serial test is not starved by the other worker's stream of ordinary tests."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    folder = item.config._tmp_path_factory.getbasetemp().parent  # the run's, not the worker's
    alone = item.get_closest_marker("serial") is not None
    with open(folder / "turnstile.lock", "a") as turnstile, open(folder / "room.lock", "a") as room:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(room, fcntl.LOCK_UN)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Outside pytest-timeout's own wrapper: time spent waiting for the machine is not the
    test's."""
    with _share_of_the_machine(item):
        yield


@pytest.fixture(params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def backend(request) -> str:
    return request.param


@pytest.fixture
def sandbox_config(backend) -> SandboxConfig:
    return SandboxConfig(backend=backend)


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The built-in SmolLM2-135M-Instruct folder (converted once into the cache)."""
    from skyrl_agent.model.names import resolve_model
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

    from skyrl_agent.sandboxes.local_disk import reap_stale_sandboxes

    folder = Path(tempfile.mkdtemp(prefix="skyrl-test-root-"))
    folder.chmod(0o755)
    yield folder
    # A run the test killed (a process, a Ray node) leaves its sandboxes, mounted disks
    # included, for the next run's reaping; there is none after the test: reap them here
    # (retried while a killed process is still being torn down).
    for _ in range(20):
        reap_stale_sandboxes(folder)
        mounted = [line for line in Path("/proc/mounts").read_text().splitlines()
                   if f" {folder}/" in line]
        if not mounted:
            break
        time.sleep(0.5)
    shutil.rmtree(folder, ignore_errors=True)
    assert not mounted, f"the test left sandbox disks mounted: {mounted}"


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
