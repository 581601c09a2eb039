"""Terminus and CodeAct driven by a scripted-reply server through real local sandboxes.

Each agent goes through: success; malformed output; a command that outlives its wait; a context
overflow that summarizes into a second segment and then succeeds.
"""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from skyrl_agent.agents.codeact import CodeActAgent
from skyrl_agent.agents.terminus import TerminusAgent
from skyrl_agent.collector.one_sample import run_rollout
from skyrl_agent.config import RunConfig
from skyrl_agent.inference.client import InferenceClient
from skyrl_agent.llm.session import LLMSession, SessionConfig
from skyrl_agent.tasks import find_task
from skyrl_agent.types import FinishReason
from tests.scripted_server import ScriptedServer, replies

pytestmark = pytest.mark.slow
HELLO = "printf 'Hello from the terminal!\\n' > /app/greeting.txt"


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    return AutoTokenizer.from_pretrained(smollm2_dir)


DEFAULT_SESSION = SessionConfig(max_tokens=400)


async def rollout(agent, task_name, script, tokenizer, session=DEFAULT_SESSION,
                  config: RunConfig | None = None):
    async with (ScriptedServer(tokenizer, script) as server,
                InferenceClient([server.url]) as client):
        def sessions(agent, session_id):
            return LLMSession(client, tokenizer, session, tools=agent.tools,
                              session_id=session_id)
        trajectory = await run_rollout(find_task(task_name), 0, agent, config or RunConfig(),
                                       sessions)
    prompts = [tokenizer.decode(p) for p in server.prompts]
    return trajectory, prompts


def assert_token_exact(trajectory):
    for segment in trajectory.segments:
        assert segment.is_token_consistent()
        for turn in segment.turns:
            assert len(turn.completion_logprobs) == len(turn.completion_ids) > 0
    assert "drift_tokens" in trajectory.metrics


def terminus(keystrokes: str = "", duration: float = 0.3, complete: bool = False) -> str:
    commands = [{"keystrokes": keystrokes, "duration": duration}] if keystrokes else []
    return json.dumps({"analysis": "looking", "plan": "act", "commands": commands,
                       "task_complete": complete})


DONE = terminus(complete=True)


async def test_terminus_success(tokenizer, sandbox_config):
    trajectory, prompts = await rollout(
        TerminusAgent(), "demo/hello-file", replies(terminus(HELLO + "\n"), DONE, DONE), tokenizer,
        config=RunConfig(sandbox=sandbox_config))
    assert trajectory.finish_reason == FinishReason.STOP and trajectory.reward.value == 1.0
    assert trajectory.num_turns == 3 and len(trajectory.segments) == 1
    assert "Are you sure" not in prompts[1] and "You marked the task as complete" in prompts[2]
    assert_token_exact(trajectory)


async def test_terminus_malformed_reply_is_corrected(tokenizer):
    script = replies("Sure! I will create the file now.", '{"commands": "ls"}',
                     terminus(HELLO + "\n"), DONE, DONE)
    trajectory, prompts = await rollout(TerminusAgent(), "demo/hello-file", script, tokenizer)
    assert trajectory.metrics["parse_errors"] == 2 and trajectory.reward.value == 1.0
    assert "no JSON object found" in prompts[1] and '"commands" must be a list' in prompts[2]
    assert_token_exact(trajectory)


async def test_terminus_wait_is_capped_and_ctrl_c_recovers(tokenizer):
    script = replies(terminus("sleep 30\n", duration=120), terminus("C-c", 0.2),
                     terminus(HELLO + "\n"), DONE, DONE)
    agent = TerminusAgent(max_wait_s=0.5)
    trajectory, prompts = await rollout(agent, "demo/hello-file", script, tokenizer)
    assert trajectory.metrics["capped_waits"] == 1 and "waits are capped at 0.5 s" in prompts[1]
    assert "^C" in prompts[2]
    assert trajectory.reward.value == 1.0
    assert trajectory.agent_time_s < 30


async def test_a_straggler_is_stopped_by_its_token_budget_and_still_verified(tokenizer):
    """Stops: an agent that keeps talking past agent.max_sampled_tokens (a straggler)."""
    script = replies(*[terminus("echo busy\n")] * 20)
    budget = SessionConfig(max_tokens=400, max_sampled_tokens=150)
    trajectory, prompts = await rollout(TerminusAgent(), "demo/hello-file", script, tokenizer,
                                        session=budget)
    assert trajectory.finish_reason == FinishReason.TOKEN_BUDGET and not trajectory.masked
    assert trajectory.reward.reason is None and trajectory.reward.value == 0.0  # verified
    assert sum(len(t.completion_ids) for s in trajectory.segments for t in s.turns) <= 150
    assert 1 < len(prompts) < 20


def overflow_script(busy: str, solve: str, done: list[str]) -> tuple:
    """Busy replies until a summary was asked for, then solve and finish."""
    state = {"summarized": False, "queue": [solve, *done]}

    def script(prompt: str) -> str:
        last_user = prompt.rsplit("<|im_start|>user", 1)[-1]
        if "Write a summary of your progress" in last_user:
            state["summarized"] = True
            return "Summary: I listed numbers; the greeting file is still missing."
        return state["queue"].pop(0) if state["summarized"] else busy

    return script, state


async def check_summarized(trajectory, prompts):
    assert len(trajectory.segments) == 2, trajectory.metrics
    first, _ = trajectory.segments
    assert first.summary_turn_index == len(first.turns) - 1
    assert trajectory.metrics["summaries"] == 1
    restart = [p for p in prompts if "Summary of your earlier work" in p]
    assert restart and "greeting file is still missing" in restart[0]
    assert trajectory.reward.value == 1.0 and trajectory.finish_reason == FinishReason.STOP
    assert_token_exact(trajectory)


async def test_terminus_context_overflow_summarizes_into_a_new_segment(tokenizer):
    script, _ = overflow_script(terminus("seq 1 40\n"), terminus(HELLO + "\n"), [DONE, DONE])
    session = SessionConfig(max_context_tokens=2000, max_tokens=200, summary_max_tokens=100)
    trajectory, prompts = await rollout(TerminusAgent(), "demo/hello-file", script, tokenizer,
                                        session)
    await check_summarized(trajectory, prompts)


def call(name: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>{v}</parameter>\n" for k, v in params.items())
    return f"I will use {name}.\n<function={name}>\n{body}</function>"


FINISH = call("finish", message="done")


async def test_codeact_success_with_editor_and_native_calls(tokenizer, sandbox_config):
    native = json.dumps({"name": "str_replace_editor", "arguments": {
        "command": "str_replace", "path": "paginate.py", "old_str": "start = page * per_page",
        "new_str": "start = (page - 1) * per_page"}})
    script = replies(
        call("str_replace_editor", command="view", path="/app/paginate.py"),
        call("think", thought="Two off-by-one bugs."),
        call("str_replace_editor", command="str_replace", path="/app/paginate.py",
             old_str="return total_items // per_page",
             new_str="return (total_items + per_page - 1) // per_page"),
        f"<tool_call>\n{native}\n</tool_call>",
        call("execute_bash", command="cd /app && python3 -c 'import paginate as p; "
             "print(p.page_count(7, 3), p.get_page(list(range(1, 8)), 3, 3))'"),
        FINISH)
    trajectory, prompts = await rollout(CodeActAgent(), "demo/python-offbyone", script, tokenizer,
                                        config=RunConfig(sandbox=sandbox_config))
    assert "def page_count" in prompts[1] and "Edited /app/paginate.py" in prompts[3]
    assert "3 [7]" in prompts[5] and "[exit code 0]" in prompts[5]
    assert trajectory.reward.value == 1.0 and trajectory.num_turns == 6
    assert trajectory.metrics["calls_str_replace_editor"] == 3
    assert_token_exact(trajectory)


async def test_codeact_malformed_and_unknown_tool(tokenizer):
    script = replies("Let me think about what to do.", call("browse", url="x"),
                     call("execute_bash", command=HELLO), FINISH)
    trajectory, prompts = await rollout(CodeActAgent(), "demo/hello-file", script, tokenizer)
    assert trajectory.metrics["parse_errors"] == 1 and "has no tool call" in prompts[1]
    assert "no tool named 'browse'" in prompts[2]
    assert trajectory.reward.value == 1.0


async def test_codeact_command_timeout_and_working_directory(tokenizer):
    script = replies(call("execute_bash", command="sleep 30", timeout="1"),
                     call("execute_bash", command="cd /tmp"),
                     call("execute_bash", command="pwd"),
                     call("execute_bash", command=HELLO), FINISH)
    agent = CodeActAgent(command_timeout_s=5)
    trajectory, prompts = await rollout(agent, "demo/hello-file", script, tokenizer)
    assert "stopped after 1 s" in prompts[1] and trajectory.metrics["command_timeouts"] == 1
    assert "/tmp\n[exit code 0]" in prompts[3]
    assert trajectory.reward.value == 1.0 and trajectory.agent_time_s < 30


async def test_codeact_context_overflow_summarizes_into_a_new_segment(tokenizer):
    script, _ = overflow_script(call("execute_bash", command="seq 1 60"),
                                call("execute_bash", command=HELLO), [FINISH])
    session = SessionConfig(max_context_tokens=2000, max_tokens=200, summary_max_tokens=100)
    trajectory, prompts = await rollout(CodeActAgent(), "demo/hello-file", script, tokenizer,
                                        session)
    await check_summarized(trajectory, prompts)


async def test_a_sandbox_that_dies_gives_a_masked_trajectory(tokenizer):
    script = replies(call("execute_bash", command="sleep 20", timeout="60"),
                     call("execute_bash", command="ls"), FINISH)
    config = RunConfig(sandbox={"deadline_s": 3})
    trajectory, _ = await rollout(CodeActAgent(), "demo/hello-file", script, tokenizer,
                                  config=config)
    assert trajectory.masked and trajectory.finish_reason == FinishReason.SANDBOX_ERROR
    assert "deadline" in trajectory.mask_reason
    assert trajectory.num_turns >= 1  # the turns recorded before it died are kept


async def test_a_failing_model_server_gives_a_masked_trajectory(tokenizer):
    def broken(prompt: str) -> str:
        raise RuntimeError("model exploded")

    trajectory, _ = await rollout(TerminusAgent(), "demo/hello-file", broken, tokenizer)
    assert trajectory.masked and trajectory.finish_reason == FinishReason.ERROR
    assert "model server" in trajectory.mask_reason and "500" in trajectory.mask_reason


async def test_terminal_types_semicolons_and_keys_exactly():
    from skyrl_agent.config import SandboxConfig
    from skyrl_agent.envs.env import Env
    from skyrl_agent.sandboxes.base import SandboxSpec, create_sandbox

    task = find_task("demo/hello-file")
    config = SandboxConfig()
    async with create_sandbox(SandboxSpec.from_task(task, config), config) as sandbox:
        terminal = Env(task, sandbox).terminal
        await terminal.send_keys("echo one; echo two;\necho three\\;\n", 0.5)
        await terminal.send_keys("sleep 30\n", 0.2)
        await terminal.send_keys("C-c", 0.3)
        screen = await terminal.capture()
    assert "echo one; echo two;\none\ntwo\n" in screen
    assert "echo three\\;\nthree;\n" in screen
    assert "^C" in screen
