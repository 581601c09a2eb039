"""The reward protocol, end to end in real sandboxes: every failure is reward 0 with a reason."""

from __future__ import annotations

import dataclasses
import json
import secrets

import pytest

from skyrl_agent.config import SandboxConfig, VerifierConfig
from skyrl_agent.envs.episode import AgentOutcome, fresh_sandboxes, run_episode
from skyrl_agent.envs.verifier import parse_reward_json
from skyrl_agent.tasks import load_task
from skyrl_agent.types import FailureKind, FinishReason, Reward
from tests.helpers import make_task

R = "/logs/verifier"


async def verify_task(tmp_path, test_sh: str, config: SandboxConfig, agent_cmd: str | None = None,
                      mode: str = "separate", **task_args):
    """One episode whose agent runs `agent_cmd`; returns the reward."""
    task = load_task(make_task(tmp_path, "verify", test_sh, **task_args))

    async def act(env) -> AgentOutcome:
        if agent_cmd:
            await env.exec(agent_cmd, timeout=30)
        return AgentOutcome(FinishReason.STOP)

    episode = await run_episode(task, act, fresh_sandboxes(config),
                                VerifierConfig(default_mode=mode))
    assert episode.mode == mode
    return episode.reward


@pytest.mark.parametrize("test_sh, value, components, reason", [
    (f"echo 0.75 > {R}/reward.txt\n", 0.75, {"reward": 0.75}, None),
    (f"echo 1 > {R}/reward.txt; echo '{{\"reward\": 0.5, \"style\": 1}}' > {R}/reward.json\n",
     0.5, {"reward": 0.5, "style": 1.0}, None),
    (f"echo '{{\"a\": 1, \"b\": 0}}' > {R}/reward.json\n", 0.5, {"a": 1.0, "b": 0.0}, None),
    ("exit 3\n", 0.0, {}, "no reward file (test.sh exited 3)"),
    (f"echo banana > {R}/reward.txt\n", 0.0, {}, "unreadable reward.txt"),
    (f"echo nan > {R}/reward.txt\n", 0.0, {}, "unreadable reward.txt"),
    (f"echo '{{\"reward\": \"high\"}}' > {R}/reward.json\n", 0.0, {}, "not a number"),
    (f"echo '[1' > {R}/reward.json\n", 0.0, {}, "unreadable reward.json"),
])
async def test_reward_files(tmp_path, test_sh, value, components, reason):
    reward = await verify_task(tmp_path, test_sh, SandboxConfig())
    assert reward.value == value
    assert dict(reward.components) == components
    if reason is None:
        assert reward.reason is None
    else:
        assert reward.reason and reason in reward.reason


async def test_verifier_timeout(tmp_path):
    reward = await verify_task(tmp_path, f"sleep 30; echo 1 > {R}/reward.txt\n", SandboxConfig(),
                               verifier_timeout=2)
    assert reward.value == 0.0 and "timed out after 2s" in reward.reason


@pytest.mark.parametrize("mode", ["separate", "shared"])
async def test_stale_rewards_and_planted_tests_are_replaced(tmp_path, backend, mode):
    # The agent writes a reward and a fake test; neither may count, in either mode.
    plant = (f"mkdir -p {R} /tests && echo 1 > {R}/reward.txt && "
             f"echo '{{\"reward\": 1}}' > {R}/reward.json && "
             f"printf 'echo 1 > {R}/reward.txt' > /tests/test.sh")
    reward = await verify_task(tmp_path, "true\n", SandboxConfig(backend=backend), plant, mode)
    assert reward.value == 0.0 and "no reward file" in reward.reason


def test_parse_reward_json_rejects_non_finite():
    with pytest.raises(ValueError):
        parse_reward_json('{"reward": Infinity}')
    with pytest.raises(ValueError):
        parse_reward_json('{"ok": true}')
    assert parse_reward_json('{"reward": 1, "x": 0.5}') == (1.0, {"reward": 1.0, "x": 0.5})


async def test_tests_run_from_tests_with_the_verifier_environment(tmp_path):
    # cwd is /tests (never the agent's workdir), and the environment is the sandbox's own.
    test_sh = f"[ \"$PWD\" = /tests ] && [ \"$HOME\" = /root ] && echo 1 > {R}/reward.txt\n"
    reward = await verify_task(tmp_path, test_sh, SandboxConfig())
    assert reward.value == 1.0, reward.reason


async def test_declared_artifacts_alone_reach_the_verifier(tmp_path, backend):
    # Harbor's task-level `artifacts` (relative paths under the workdir, `exclude` patterns):
    # exactly those are carried into the fresh sandbox, and nothing else the agent wrote.
    test_sh = ("[ -f /app/out.txt ] && [ -f /data/keep ] && [ ! -e /data/x.tmp ] && "
               f"[ ! -e /app/other.txt ] && echo 1 > {R}/reward.txt\n")
    task_dir = make_task(tmp_path, "declared", test_sh)
    toml = task_dir / "task.toml"
    toml.write_text('artifacts = ["out.txt", {source = "/data", exclude = ["*.tmp"]}, '
                    '"out.txt"]\n' + toml.read_text())
    agent = ("echo 42 > /app/out.txt && echo no > /app/other.txt && mkdir -p /data && "
             "echo k > /data/keep && echo t > /data/x.tmp")

    async def act(env) -> AgentOutcome:
        await env.exec(agent, timeout=30)
        return AgentOutcome(FinishReason.STOP)

    episode = await run_episode(load_task(task_dir), act,
                                fresh_sandboxes(SandboxConfig(backend=backend)), VerifierConfig())
    assert episode.reward.value == 1.0, episode.reward.reason


def verifier_task(tmp_path, test_sh: str, settings: str, **task_args):
    """A task whose task.toml [verifier] table also holds `settings` (TOML lines)."""
    task_dir = make_task(tmp_path, "verifier-settings", test_sh, **task_args)
    toml = task_dir / "task.toml"
    toml.write_text(toml.read_text().replace("[verifier]\n", f"[verifier]\n{settings}\n"))
    return load_task(task_dir)


async def nothing(env) -> AgentOutcome:
    return AgentOutcome(FinishReason.STOP)


@pytest.mark.parametrize("mode", ["separate", "shared"])
async def test_test_sh_gets_the_verifiers_env(tmp_path, sandbox_config, mode):
    """Stops: test.sh running without the task's [verifier] env (on top of the sandbox's own
    environment, which it still has)."""
    test_sh = ('[ "$GREETING" = "hello verifier" ] && [ "$MODE" = strict ] && '
               f'[ "$FROM_IMAGE" = yes ] && echo 1 > {R}/reward.txt\n')
    task = verifier_task(tmp_path, test_sh,
                         'env = { GREETING = "hello verifier", MODE = "strict" }',
                         dockerfile="FROM ubuntu:24.04\nENV FROM_IMAGE=yes\nWORKDIR /app\n")
    episode = await run_episode(task, nothing, fresh_sandboxes(sandbox_config),
                                VerifierConfig(default_mode=mode))
    assert episode.reward.value == 1.0, episode.reward.reason


@pytest.mark.parametrize("mode", ["separate", "shared"])
async def test_test_sh_runs_as_the_verifiers_user(tmp_path, mode):
    """Stops: test.sh running without the task's [verifier] user (as root instead). The local
    sandbox can only be root, so a task asking for another user is refused there, never
    verified as root; one asking for root is verified."""
    test_sh = f'[ "$(id -u)" = 0 ] && echo 1 > {R}/reward.txt\n'
    task = verifier_task(tmp_path, test_sh, 'user = "nobody"')
    episode = await run_episode(task, nothing, fresh_sandboxes(SandboxConfig()),
                                VerifierConfig(default_mode=mode))
    assert episode.reward.value == 0.0
    assert episode.outcome.failure == FailureKind.UNSUPPORTED
    assert "not as 'nobody'" in episode.reward.reason
    task = verifier_task(tmp_path / "root", test_sh, 'user = "root"')
    episode = await run_episode(task, nothing, fresh_sandboxes(SandboxConfig()),
                                VerifierConfig(default_mode=mode))
    assert episode.reward.value == 1.0, episode.reward.reason


@pytest.mark.docker
@pytest.mark.parametrize("mode", ["separate", "shared"])
async def test_test_sh_runs_as_a_non_root_verifier_user_on_docker(tmp_path, mode):
    """Stops: test.sh running as root although [verifier] names another user, and a non-root
    test.sh unable to write its reward (or use its HOME)."""
    test_sh = (f'[ "$(id -un)" = nobody ] && touch "$HOME/ok" && echo 1 > {R}/reward.txt\n')
    task = verifier_task(tmp_path, test_sh, 'user = "nobody"',
                         dockerfile="FROM ubuntu:24.04\nWORKDIR /app\n")
    episode = await run_episode(task, nothing, fresh_sandboxes(SandboxConfig(backend="docker")),
                                VerifierConfig(default_mode=mode))
    assert episode.reward.value == 1.0, episode.reward.reason


@dataclasses.dataclass(frozen=True)
class _Nonce:
    value: str

    def to_json(self) -> str:
        return json.dumps({"nonce": self.value})


@dataclasses.dataclass(frozen=True)
class _EchoGrader:
    """A LogGrader whose tests must echo the verification's nonce (a fresh one each time)."""

    with_challenge: bool
    test_output: str = f"{R}/echo.txt"

    def challenge(self) -> _Nonce | None:
        return _Nonce(secrets.token_hex(8)) if self.with_challenge else None

    def grade(self, script_log: str, test_output: str | None, challenge=None) -> Reward:
        echoed = "" if test_output is None else test_output
        passed = challenge.value in echoed if challenge is not None else echoed == "none\n"
        return Reward(float(passed), {"reward": float(passed)}, reason=script_log.strip() or None)


@pytest.mark.parametrize("with_challenge", [True, False])
async def test_a_graders_challenge_reaches_its_tests_alone(tmp_path, with_challenge):
    """The verifier writes a grader's fresh challenge beside test.sh, after the agent is gone,
    and grades with that same challenge; the agent's sandbox never holds it."""
    test_sh = (f"cat /tests/challenge.json > {R}/echo.txt 2>/dev/null || echo none > {R}/echo.txt;"
               f" stat -c %a /tests/challenge.json 2>/dev/null\n")
    task = load_task(make_task(tmp_path, "challenged", test_sh))
    task = dataclasses.replace(task, grader=_EchoGrader(with_challenge))
    seen = {}

    async def act(env) -> AgentOutcome:
        seen["agent"] = (await env.exec("ls /tests/challenge.json", timeout=30)).ok
        return AgentOutcome(FinishReason.STOP)

    episode = await run_episode(task, act, fresh_sandboxes(SandboxConfig()), VerifierConfig())
    assert seen == {"agent": False}
    assert episode.reward.value == 1.0, episode.reward
    assert episode.reward.reason == ("600" if with_challenge else None)  # root's alone
