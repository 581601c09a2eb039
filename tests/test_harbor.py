"""Harbor, both ways round, against the real `harbor` package:
- a Harbor Trial runs our Terminus agent against the embedded server, in our bubblewrap sandbox
  as a Harbor environment, and its result carries the sampled token ids and logprobs, one
  rollout detail per segment across a self-summarization;
- Harbor's own oracle passes in that environment (its verifier reads the reward through it);
- `--sandbox harbor:TYPE` runs our agents and verifier in a Harbor environment: ours, and
  Harbor's own docker environment (`harbor:docker`);
- links an agent plants are never followed on the host, either way."""

from __future__ import annotations

import asyncio
import io
import json
import os
from pathlib import Path

import pytest

from skyrl_agent.inference.process import embedded_server
from skyrl_agent.sandboxes.artifacts import ArtifactLimits, BundleWriter
from skyrl_agent.sandboxes.harbor_environment import extract_bundle
from tests.conftest import DEMO
from tests.test_cli import assert_one_line_error, run
from tests.tiny_models import tiny_llama_dir

pytestmark = pytest.mark.slow
OUR_ENVIRONMENT = "skyrl_agent.harbor:SkyrlEnvironment"


@pytest.fixture(autouse=True)
def _offline_litellm(monkeypatch):
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # harbor imports litellm


async def _trial(tmp_path: Path, task: Path, agent: dict, env_kwargs: dict | None = None):
    from harbor.models.trial.config import (
        AgentConfig,
        EnvironmentConfig,
        TaskConfig,
        TrialConfig,
    )
    from harbor.trial.trial import Trial

    config = TrialConfig(task=TaskConfig(path=task), trials_dir=tmp_path / "trials",
                         agent=AgentConfig(**agent),
                         environment=EnvironmentConfig(import_path=OUR_ENVIRONMENT,
                                                       kwargs=env_kwargs or {}))
    trial = await Trial.create(config)
    return await trial.run()


@pytest.fixture(scope="module")
def long_tiny_model(smollm2_dir, tmp_path_factory) -> Path:
    """The tiny Llama with a 4096-token context: its replies fill the context fast enough for a
    summary within a dozen turns."""
    return tiny_llama_dir(tmp_path_factory.mktemp("long-tiny"), smollm2_dir, max_positions=4096)


def test_a_harbor_trial_of_our_terminus_carries_its_tokens(long_tiny_model, tmp_path,
                                                          work_root):
    tiny_model_dir = long_tiny_model
    server = embedded_server(str(tiny_model_dir))
    url = server.start()
    try:
        result = asyncio.run(_trial(tmp_path, DEMO / "hello-file", {
            "import_path": "skyrl_agent.harbor:TerminusHarborAgent",
            "model_name": "tiny", "kwargs": {
                "endpoint": url, "tokenizer": str(tiny_model_dir),
                "settings": {"agent.max_turns": 11, "inference.max_tokens": 96,
                             "agent.max_context_tokens": 2000}}},
            {"work_root": str(work_root)}))
    finally:
        server.stop()
    assert result.exception_info is None
    assert result.verifier_result is not None
    assert result.verifier_result.rewards == {"reward": 0.0}  # a random model writes nothing
    details = result.agent_result.rollout_details
    assert result.agent_result.metadata["summaries"] >= 1
    assert len(details) == result.agent_result.metadata["summaries"] + 1  # one per segment
    for detail in details:
        prompts, completions = detail["prompt_token_ids"], detail["completion_token_ids"]
        assert completions and len(prompts) == len(completions) == len(detail["logprobs"])
        for ids, logprobs in zip(completions, detail["logprobs"], strict=True):
            assert ids and len(ids) == len(logprobs) and all(lp <= 0 for lp in logprobs)
        for k in range(1, len(prompts)):  # each prompt extends the last prompt + completion
            history = prompts[k - 1] + completions[k - 1]
            assert prompts[k][:len(history)] == history
    turns = sum(len(d["completion_token_ids"]) for d in details)
    assert result.agent_result.n_output_tokens == sum(
        len(ids) for d in details for ids in d["completion_token_ids"])
    assert turns == result.agent_result.metadata["turns"]


def test_harbors_oracle_passes_in_our_sandbox(tmp_path, work_root):
    result = asyncio.run(_trial(tmp_path, DEMO / "csv-column-sum", {"name": "oracle"},
                                {"work_root": str(work_root)}))
    assert result.exception_info is None
    assert result.verifier_result.rewards["reward"] == 1.0  # read by Harbor through us


HARBOR_KINDS = [OUR_ENVIRONMENT, pytest.param("docker", marks=pytest.mark.docker)]


@pytest.mark.parametrize("kind", HARBOR_KINDS)
@pytest.mark.parametrize(("agent", "expected"), [("oracle", 1.0), ("nop", 0.0)])
def test_our_agents_run_in_a_harbor_environment(kind, agent, expected):
    """Through the harbor: backend (our Sandbox over a Harbor environment: ours, and Harbor's
    own docker environment), separate-mode verification included: the artifacts leave through
    Harbor's download_dir and come back through its upload."""
    result = run("tasks", "check", "demo", "--agent", agent, "--json", "-j", "2",
                 "--sandbox", f"harbor:{kind}",
                 "--set", "tasks.include=[python-bugfix,git-init-commit,extract-archive]")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(rows) == 3
    assert all(row["reward"] == expected and row["reason"] is None for row in rows), rows


@pytest.mark.docker
def test_harbor_docker_runs_our_terminus_with_the_real_model(tmp_path, smollm2_dir):
    """`--sandbox harbor:docker`: our Terminus, against the embedded server, acts in Harbor's
    docker environment (its keystrokes reach tmux there) and is stored token-exact."""
    from skyrl_agent.data.store import TrajectoryStore

    result = run("rollout", "--agent", "terminus", "--tasks", str(DEMO / "hello-file"),
                 "--sandbox", "harbor:docker", "--output", str(tmp_path / "run"),
                 "--set", "agent.max_turns=2", "--set", "inference.max_tokens=64")
    assert result.returncode == 0, result.stderr[-2000:]
    contents = TrajectoryStore(tmp_path / "run").load()
    assert not contents.problems and len(contents.trajectories) == 1
    trajectory = contents.trajectories[0]
    assert not trajectory.masked, trajectory.mask_reason
    assert trajectory.num_turns >= 1 and 0.0 <= trajectory.reward.value <= 1.0
    for segment in trajectory.segments:
        assert segment.is_token_consistent()
        for turn in segment.turns:
            assert len(turn.completion_logprobs) == len(turn.completion_ids) > 0


@pytest.mark.docker
def test_harbor_docker_kills_what_the_agent_left_running():
    """Attack: the agent leaves processes to act after it finished: a background job, and one
    that detaches under PID 1 as a binary named `sleep`, like the environment's keeper. Both are
    killed before artifacts are collected; the environment's own processes live on."""
    from skyrl_agent.config import SandboxConfig
    from skyrl_agent.sandboxes.base import SandboxSpec
    from skyrl_agent.sandboxes.harbor import HarborSandbox
    from skyrl_agent.tasks import find_task

    listing = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done"

    async def scenario() -> tuple[str, str]:
        config = SandboxConfig(backend="harbor:docker")
        spec = SandboxSpec.from_task(find_task(str(DEMO / "hello-file")), config)
        sandbox = HarborSandbox(spec, config)
        await sandbox.start()
        try:
            await sandbox.exec("nohup sleep 1000 >/dev/null 2>&1 & cp /bin/sleep /tmp/sleep && "
                               "(setsid /tmp/sleep 1001 >/dev/null 2>&1 &); sleep 0.5")
            before = (await sandbox.exec(listing, user=0)).stdout
            await sandbox.kill_processes()
            return before, (await sandbox.exec(listing, user=0)).stdout
        finally:
            await sandbox.stop()

    before, after = asyncio.run(scenario())
    assert "sleep 1000" in before and "/tmp/sleep 1001" in before
    assert "sleep 1000" not in after and "1001" not in after
    assert "sleep infinity" in after  # Harbor's keeper: the container lives on for collection


def test_a_harbor_backend_without_a_kind_is_one_line():
    result = run("tasks", "check", str(DEMO / "hello-file"), "--agent", "oracle",
                 "--sandbox", "harbor")
    assert_one_line_error(result, "harbor:TYPE")


def test_planted_links_are_not_followed_on_the_host(tmp_path):
    """Attack: the agent makes Harbor's reward file a link to a host file, and a link that
    climbs out of the downloaded folder; neither lands on the host."""
    buffer = io.BytesIO()
    with BundleWriter(buffer, ArtifactLimits()) as writer:
        writer.add_dir("logs/verifier")
        writer.add_symlink("logs/verifier/reward.txt", "/etc/passwd")
        writer.add_symlink("logs/verifier/up", "../../../../../../etc")
        writer.add_symlink("logs/verifier/inside", "kept.txt")
        data = b"0.5\n"
        writer.add_file("logs/verifier/kept.txt", io.BytesIO(data), len(data))
    target = tmp_path / "verifier"
    extract_bundle(buffer.getvalue(), "/logs/verifier", target)
    assert sorted(os.listdir(target)) == ["inside", "kept.txt"]
    assert (target / "inside").read_text() == "0.5\n"  # a link inside the folder is kept


def test_harbor_options_are_checked_by_harbor_before_any_work():
    """A typo'd or ill-typed environment option stops the run in one line, in Harbor's own
    words (the environment's options model), before a sandbox starts; so do options given to a
    backend that takes none."""
    include = ["--set", "tasks.include=[hello-file]"]
    for kind, options, needle in [("docker", "{kep: true}", "Unknown option 'kep'"),
                                  (OUR_ENVIRONMENT, "{backend: podman}", "backend")]:
        result = run("tasks", "check", "demo", "--agent", "oracle", "--sandbox", f"harbor:{kind}",
                     "--set", f"sandbox.harbor_options={options}", *include)
        assert_one_line_error(result, needle)
    result = run("tasks", "check", "demo", "--agent", "oracle", "--sandbox", "local",
                 "--set", "sandbox.harbor_options={backend: docker}", *include)
    assert_one_line_error(result, "harbor_options")


def test_harbor_options_reach_the_environment(work_root):
    """The options the check passed are the ones the environment is built with: our own
    environment keeps its sandbox's private files under the `work_root` it was given."""
    from skyrl_agent.config import SandboxConfig
    from skyrl_agent.sandboxes.base import SandboxSpec
    from skyrl_agent.sandboxes.harbor import HarborSandbox
    from skyrl_agent.tasks import find_task

    config = SandboxConfig(backend=f"harbor:{OUR_ENVIRONMENT}",
                           harbor_options={"work_root": str(work_root)})
    HarborSandbox.preflight([], config)

    async def scenario() -> tuple[list[Path], str]:
        spec = SandboxSpec.from_task(find_task(str(DEMO / "hello-file")), config)
        async with HarborSandbox(spec, config) as sandbox:
            return list(work_root.iterdir()), (await sandbox.exec("echo hi")).stdout

    inside, said = asyncio.run(scenario())
    assert inside and said == "hi\n"
    assert not list(work_root.iterdir())  # and stopped with the sandbox


@pytest.mark.docker
@pytest.mark.parametrize("agent", ["oracle", "nop"])
def test_harbor_run_and_tasks_check_give_the_same_rewards(agent, tmp_path, work_root):
    """The CI slice of benchmarks/harbor_parity.py: the trial `harbor run` runs (Harbor's
    agent, its verifier) in a container of our docker backend, and `tasks check --sandbox
    docker`, score the same tasks alike. Stops: a verifier of ours that reads rewards
    differently from Harbor's, and an environment Harbor 0.26 cannot verify in (its output
    folders are the environment's to create)."""
    names = ["python-bugfix", "extract-archive"]
    result = run("tasks", "check", "demo", "--agent", agent, "--json", "-j", "2",
                 "--sandbox", "docker", "--set", f"tasks.include=[{','.join(names)}]")
    assert result.returncode in (0, 1), result.stderr
    ours = {row["task"]: row["reward"] for row in map(json.loads, result.stdout.splitlines())}
    harbor = {}
    for name in names:
        trial = asyncio.run(_trial(tmp_path, DEMO / name, {"name": agent},
                                   {"backend": "docker", "work_root": str(work_root)}))
        assert trial.exception_info is None, trial.exception_info
        harbor[f"demo/{name}"] = trial.verifier_result.rewards["reward"]
    assert harbor == ours == {f"demo/{name}": float(agent == "oracle") for name in names}
