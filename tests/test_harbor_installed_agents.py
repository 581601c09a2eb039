"""Harbor's installed agents, unmodified, through Harbor's relay into our capture proxy.

mini-swe-agent and the OpenHands SDK run *inside* our sandbox (Harbor's adapters start them
there); the sandbox has no network, and the relay reaches it through a loopback route that
serves only the relay's path. Each job runs on a real `harbor serve` with `relay_inference` on,
and every token the embedded server sampled (a tap in front of it says which) is exactly what
the capture proxy recorded for the rollout."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from skyrl_agent.harbor.toolchains import toolchain
from tests.conftest import DEMO
from tests.test_blackbox import long_tiny_model_dir, server_url, tokenizer  # noqa: F401
from tests.test_cli import assert_one_line_error, run
from tests.test_harbor_relay import run_relayed

pytestmark = pytest.mark.slow
OUR_ENVIRONMENT = "skyrl_agent.harbor:SkyrlEnvironment"
AGENT_SETTINGS: dict[str, dict[str, Any]] = {
    # A config of its own makes mini-swe-agent's adapter ask for the wire format explicitly.
    "mini-swe-agent": {"model_api_format": "openai_chat_completions", "kwargs": {
        "max_tokens": 48, "config": {"agent": {"step_limit": 2}}}},
    "openhands-sdk": {"kwargs": {"max_iterations": 2}},
}


@pytest.fixture(autouse=True)
def _offline_litellm(monkeypatch):
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def installed_agent_job(agent: str, work_root: Path, relay_url: str,
                        backend: str = "local") -> dict[str, Any]:
    tools = toolchain(agent, work_root / "toolchains")
    return {
        "job_name": f"relay-{agent}", "n_attempts": 1, "n_concurrent_trials": 1,
        "retry": {"max_retries": 0},
        "tasks": [{"path": str(DEMO / "hello-file")}],
        "agents": [{**AGENT_SETTINGS[agent], "name": agent, "model_name": "openai/skyrl-agent",
                    "kwargs": {**AGENT_SETTINGS[agent]["kwargs"], **tools.agent_kwargs},
                    "env": tools.agent_env}],
        "environment": {"import_path": OUR_ENVIRONMENT, "mounts": tools.mounts, "kwargs": {
            "work_root": str(work_root), "relay_url": relay_url, "backend": backend}},
    }


@pytest.mark.skipif(os.geteuid() != 0, reason="the loopback route needs root")
@pytest.mark.parametrize(("agent", "backend"), [
    ("mini-swe-agent", "local"), ("openhands-sdk", "local"),
    pytest.param("mini-swe-agent", "docker", marks=pytest.mark.docker)])
async def test_an_installed_harbor_agent_runs_in_our_sandbox_token_exact(
        agent, backend, tmp_path, work_root, server_url, tokenizer):  # noqa: F811
    relayed = await run_relayed(tmp_path, server_url, tokenizer,
                                lambda url: installed_agent_job(agent, work_root, url, backend))
    trials = sorted((tmp_path / "harbor-data").rglob("trial.log"))
    context = relayed.log.read_text()[-3000:] + "".join(
        t.read_text()[-3000:] for t in trials)
    assert relayed.job.state == "finished", context
    turns = [turn for session in relayed.rollouts.sessions.values()
             for segment in session.llm.segments for turn in segment.turns]
    assert len(relayed.rollouts.sessions) == 1, context
    assert len(turns) == len(relayed.tap.calls) >= 1, context
    recorded = sorted((list(t.prompt_ids), list(t.completion_ids), list(t.completion_logprobs))
                      for t in turns)
    assert recorded == sorted(relayed.tap.sampled())


def _environment(tmp_path: Path, relay_url: str | None, hosts: list[str],
                 mounts: list[Any] | None = None, work_root: Path | None = None) -> Any:
    from harbor.models.task.config import NetworkMode, NetworkPolicy
    from harbor.models.trial.paths import TrialPaths

    from skyrl_agent.harbor import SkyrlEnvironment
    from skyrl_agent.tasks.spec import load_task

    task = load_task(DEMO / "hello-file")
    return SkyrlEnvironment(
        environment_dir=task.environment_dir, environment_name="hello", session_id="s",
        trial_paths=TrialPaths(trial_dir=tmp_path), task_env_config=task.config.environment,
        relay_url=relay_url, mounts=mounts, work_root=str(work_root) if work_root else None,
        network_policy=NetworkPolicy(network_mode=NetworkMode.ALLOWLIST, allowed_hosts=hosts)
        if hosts else None)


def test_an_allowlist_is_granted_only_as_the_relay(tmp_path):
    """Harbor allows an installed agent the relay's host; our sandbox serves exactly the relay
    there. Any other host, or an allowlist without a relay, is refused before a sandbox starts."""
    assert _environment(tmp_path, "http://127.0.0.1:9", ["127.0.0.1"]).capabilities \
        .network_allowlist
    with pytest.raises(ValueError, match="reaches only Harbor's inference relay"):
        _environment(tmp_path, "http://127.0.0.1:9", ["127.0.0.1", "example.com"])
    with pytest.raises(ValueError, match="allowlist"):
        _environment(tmp_path, None, ["127.0.0.1"])


@pytest.mark.parametrize("mount", [
    {"type": "bind", "source": "/tmp", "target": "/opt/x"},
    {"type": "volume", "source": "data", "target": "/opt/x", "read_only": True}])
def test_a_mount_an_agent_could_write_through_is_refused(tmp_path, mount):
    with pytest.raises(ValueError, match="read-only bind mounts only"):
        _environment(tmp_path, "http://127.0.0.1:9", ["127.0.0.1"], [mount])


@pytest.mark.skipif(os.geteuid() != 0, reason="the loopback route needs root")
def test_train_runs_a_harbor_agent_unmodified_through_the_relay(
        tmp_path, long_tiny_model_dir):  # noqa: F811
    """`train --agent harbor:mini-swe-agent`: each group is a Harbor job on the run's own
    `harbor serve`; the relayed rollouts are stored, trained on, and Harbor keeps its record."""
    from skyrl_agent.data.store import TrajectoryStore

    run_dir = tmp_path / "run"
    result = run("train", "--agent", "harbor:mini-swe-agent", "--tasks", str(DEMO / "hello-file"),
                 "--n", "2", "--steps", "2", "--output", str(run_dir),
                 "--set", f"inference.model={long_tiny_model_dir}",
                 "--set", "agent.max_turns=2", "--set", "inference.max_tokens=32")
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [0, 1]
    assert all(s["sampled_tokens"] > 0 and s["trajectories"] == 2 for s in steps)
    stored = TrajectoryStore(run_dir).load().trajectories
    assert stored and {t.agent for t in stored} == {"harbor:mini-swe-agent"}
    assert all(t.num_turns >= 1 and not t.masked for t in stored)
    # Whole groups only (the loop may have sampled one group ahead); every stored sample is
    # one of Harbor's rollouts (groups still running when the run ended were cancelled).
    assert len(stored) >= 4 and len(stored) % 2 == 0
    rollouts = list((run_dir / "harbor-data" / "files" / "rollouts").glob("*/*/result.json"))
    assert len(rollouts) >= len(stored)


def test_a_harbor_agent_without_root_is_refused_before_any_work(monkeypatch):
    """Without root no sandbox can reach the relay: one error up front, not a run whose every
    rollout fails inside Harbor."""
    from skyrl_agent.errors import UserError
    from skyrl_agent.harbor.relay_collector import relayed_agent_class

    assert relayed_agent_class("harbor:mini-swe-agent").harbor_name == "mini-swe-agent"
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(UserError, match="harbor:mini-swe-agent needs root"):
        relayed_agent_class("harbor:mini-swe-agent")


def test_an_agent_harbor_does_not_register_is_one_line():
    result = run("train", "--agent", "harbor:no-such-agent", "--dry-run", "--tasks", "toy")
    assert_one_line_error(result, "harbor has no agent 'no-such-agent'")


async def test_an_environment_whose_sandbox_fails_to_start_leaves_nothing(tmp_path, work_root):
    """A trial whose sandbox does not start (here: a mount source that is not there) is retried
    by Harbor; each failed start must leave no sandbox folder or disk behind."""
    from skyrl_agent.sandboxes.base import SandboxError

    missing = {"type": "bind", "source": str(tmp_path / "gone"), "target": "/opt/x",
               "read_only": True}
    environment = _environment(tmp_path, None, [], [missing], work_root)
    with pytest.raises(SandboxError):
        await environment.start(force_build=False)
    assert list(work_root.iterdir()) == []
