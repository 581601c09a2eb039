"""The reward protocol, end to end in real sandboxes: every failure is reward 0 with a reason."""

from __future__ import annotations

import pytest

from skyrl_agent.config import SandboxConfig
from skyrl_agent.envs import Env
from skyrl_agent.envs.verifier import parse_reward_json
from skyrl_agent.sandboxes.base import SandboxSpec, create_sandbox
from skyrl_agent.tasks import load_task
from tests.helpers import make_task

R = "/logs/verifier"


async def verify_task(tmp_path, test_sh: str, config: SandboxConfig, agent_cmd: str | None = None,
                      **task_args):
    task = load_task(make_task(tmp_path, "verify", test_sh, **task_args))
    async with create_sandbox(SandboxSpec.from_task(task, config), config) as sandbox:
        env = Env(task, sandbox)
        if agent_cmd:
            await env.exec(agent_cmd, timeout=30)
        return await env.verify()


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


async def test_stale_rewards_and_planted_tests_are_replaced(tmp_path, backend):
    # The agent writes a reward and a fake test; the verifier must delete and replace both.
    plant = (f"mkdir -p {R} /tests && echo 1 > {R}/reward.txt && "
             f"echo '{{\"reward\": 1}}' > {R}/reward.json && "
             f"printf 'echo 1 > {R}/reward.txt' > /tests/test.sh")
    reward = await verify_task(tmp_path, "true\n", SandboxConfig(backend=backend), plant)
    assert reward.value == 0.0 and "no reward file" in reward.reason


def test_parse_reward_json_rejects_non_finite():
    with pytest.raises(ValueError):
        parse_reward_json('{"reward": Infinity}')
    with pytest.raises(ValueError):
        parse_reward_json('{"ok": true}')
    assert parse_reward_json('{"reward": 1, "x": 0.5}') == (1.0, {"reward": 1.0, "x": 0.5})
