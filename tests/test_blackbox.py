"""Black-box agents through the capture proxy, in real local sandboxes.

Per agent: a scripted model that solves a demo task (the adapter runs the agent's commands in our
sandbox and the verifier scores it), and the embedded server with a tiny random model on demo
tasks: episodes run, verification runs, and every stored turn is token-consistent, has a logprob
per sampled token and holds exactly the ids the server sampled (read from a tap in front of it).
A random model rarely acts usefully, so the embedded runs check the pipeline, not the reward.
"""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from skyrl_agent.collector.one_sample import run_rollout
from skyrl_agent.config import RunConfig
from skyrl_agent.inference.client import InferenceClient
from skyrl_agent.inference.process import embedded_server
from skyrl_agent.llm.session import LLMSession, SessionConfig
from skyrl_agent.tasks import find_task
from skyrl_agent.types import FinishReason, Trajectory
from tests.scripted_server import ScriptedServer, replies
from tests.tap_server import TapServer

pytestmark = pytest.mark.slow
HELLO = "printf 'Hello from the terminal!\\n' > /app/greeting.txt"


@pytest.fixture(scope="module")
def long_tiny_model_dir(smollm2_dir, tmp_path_factory):
    """A tiny random Llama like conftest's, with an 8k context (the agents' own prompts are
    long) and a turn end that is sampled about a third of the time, so its replies are a few
    tokens and finish with `stop` (a model that never ends its turns only exercises the
    agents' truncation paths). Hidden dimension 0 carries a constant through the residual
    stream, and only the end-of-turn row of the output head reads it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=8192, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=tokenizer.bos_token_id, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 1.0
        model.lm_head.weight[:, 0] = 0.0
        model.lm_head.weight[tokenizer.eos_token_id, 0] = 1.3
    folder = tmp_path_factory.mktemp("tiny-llama-8k")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tokenizer(long_tiny_model_dir):
    return AutoTokenizer.from_pretrained(long_tiny_model_dir)


@pytest.fixture(scope="module")
def server_url(long_tiny_model_dir):
    with embedded_server(str(long_tiny_model_dir)) as process:
        yield process.url


async def rollouts(agent, tasks, url, tokenizer, settings: SessionConfig,
                   config: RunConfig | None = None) -> list[Trajectory]:
    async with InferenceClient([url]) as client:
        def sessions(agent, session_id):
            return LLMSession(client, tokenizer, settings, session_id=session_id)
        return [await run_rollout(find_task(name), 0, agent, config or RunConfig(), sessions)
                for name in tasks]


SCRIPTED = SessionConfig(max_tokens=200)


async def scripted(agent, task, script, tokenizer, settings=SCRIPTED):
    async with ScriptedServer(tokenizer, script) as server:
        (trajectory,) = await rollouts(agent, [task], server.url, tokenizer, settings)
    return trajectory, [tokenizer.decode(p) for p in server.prompts]


async def embedded(agent, tasks, server_url, tokenizer, settings) -> list[Trajectory]:
    async with TapServer(server_url) as tap:
        trajectories = await rollouts(agent, tasks, tap.url, tokenizer, settings)
    turns = [t for tr in trajectories for s in tr.segments for t in s.turns]
    recorded = sorted((list(t.prompt_ids), list(t.completion_ids), list(t.completion_logprobs))
                      for t in turns)
    assert recorded == sorted(tap.sampled())  # the ids the server sampled, nothing else
    for trajectory in trajectories:
        assert not trajectory.masked, trajectory.mask_reason
        assert trajectory.num_turns >= 1
        assert trajectory.reward.reason is None and trajectory.verify_time_s > 0  # verified
        for segment in trajectory.segments:
            assert segment.is_token_consistent()
            for turn in segment.turns:
                assert len(turn.completion_logprobs) == len(turn.completion_ids) > 0
    return trajectories


def bash(command: str) -> str:
    return f"I will run it.\n<function=bash>\n<parameter=command>{command}</parameter>\n</function>"


# ---- mini-swe-agent -----------------------------------------------------------------------

async def test_mini_swe_agent_solves_a_task_in_our_sandbox(tokenizer):
    from skyrl_agent.agents.blackbox.mini_swe import MiniSweAgent

    script = replies(bash(HELLO), bash("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"))
    trajectory, prompts = await scripted(MiniSweAgent(max_turns=5), "demo/hello-file", script,
                                         tokenizer)
    assert trajectory.reward.value == 1.0 and trajectory.finish_reason == FinishReason.STOP
    (segment,) = trajectory.segments
    assert len(segment.turns) == 2 and segment.is_token_consistent()
    assert trajectory.metrics["commands"] == 2 and trajectory.metrics["segment_breaks"] == 0
    assert "<function=NAME>" in prompts[0]  # the bash tool, described to a template without tools
    assert '"returncode": 0' in prompts[1]  # its observation came back as a tool message


async def test_mini_swe_agent_runs_demo_tasks_on_the_embedded_model(server_url, tokenizer):
    from skyrl_agent.agents.blackbox.mini_swe import MiniSweAgent

    settings = SessionConfig(max_tokens=24, max_context_tokens=8192)
    trajectories = await embedded(MiniSweAgent(max_turns=3), ["demo/hello-file", "demo/word-count"],
                                  server_url, tokenizer, settings)
    assert all(t.agent == "mini-swe-agent" for t in trajectories)


# ---- Harbor's terminus-2 ------------------------------------------------------------------

def terminus(keystrokes: str = "", complete: bool = False) -> str:
    commands = [{"keystrokes": keystrokes, "duration": 0.3}] if keystrokes else []
    return json.dumps({"analysis": "looking", "plan": "act", "commands": commands,
                       "task_complete": complete})


async def test_harbor_terminus_2_solves_a_task_in_our_sandbox(tokenizer):
    from skyrl_agent.agents.blackbox.terminus2 import HarborTerminus2Agent

    script = replies(terminus(HELLO + "\n"), terminus(complete=True), terminus(complete=True))
    trajectory, prompts = await scripted(HarborTerminus2Agent(max_turns=6), "demo/hello-file",
                                         script, tokenizer)
    assert trajectory.reward.value == 1.0, trajectory.reward
    (segment,) = trajectory.segments
    assert len(segment.turns) == 3 and segment.is_token_consistent()
    assert "Hello from the terminal!" in prompts[1]  # the pane, read from our sandbox's tmux


async def test_harbor_terminus_2_runs_demo_tasks_on_the_embedded_model(server_url, tokenizer):
    from skyrl_agent.agents.blackbox.terminus2 import HarborTerminus2Agent

    settings = SessionConfig(max_tokens=24, max_context_tokens=8192)
    await embedded(HarborTerminus2Agent(max_turns=3), ["demo/hello-file", "demo/word-count"],
                   server_url, tokenizer, settings)


async def test_harbor_terminus_2_compaction_becomes_new_segments(server_url, tokenizer):
    """On a small context Terminus-2 summarizes (summary, questions, answers, handoff); each
    rewrite is a new segment, counted, and every segment stays token-exact."""
    from skyrl_agent.agents.blackbox.terminus2 import HarborTerminus2Agent

    settings = SessionConfig(max_tokens=32, max_context_tokens=2500)
    agent = HarborTerminus2Agent(max_turns=6, summarize_free_tokens=1700)
    (trajectory,) = await embedded(agent, ["demo/hello-file"], server_url, tokenizer, settings)
    assert trajectory.metrics["summarizations"] >= 1
    assert len(trajectory.segments) >= 2
    assert trajectory.metrics["segment_breaks"] == len(trajectory.segments) - 1 >= 1


async def test_a_harbor_trial_of_harbors_terminus_2_is_a_stored_run(tokenizer, tmp_path,
                                                                   work_root):
    """Harbor's lifecycle (its agent, its verifier) in our sandbox, with the model calls
    through the capture proxy: the trial comes back as one of our trajectories, stored and
    read by `eval` like any run."""
    from skyrl_agent.data.run_dir import RunDir, RunRecord
    from skyrl_agent.data.store import TrajectoryStore
    from skyrl_agent.harbor.trial import harbor_trial
    from tests.test_cli import run

    script = replies(terminus(HELLO + "\n"), *[terminus(complete=True)] * 6)
    async with (ScriptedServer(tokenizer, script) as server,
                InferenceClient([server.url]) as client):
        llm = LLMSession(client, tokenizer, SCRIPTED)
        trajectory = await harbor_trial(find_task("demo/hello-file"), "terminus-2", llm,
                                        tmp_path / "trials", agent_kwargs={"max_turns": 6,
                                                      "proactive_summarization_threshold": 0},
                                        environment_kwargs={"work_root": str(work_root)})
    assert not trajectory.masked, trajectory.mask_reason
    assert trajectory.reward.value == 1.0  # Harbor's verifier, through our environment
    (segment,) = trajectory.segments
    assert len(segment.turns) == 3 and segment.is_token_consistent()
    assert [t.completion_ids for t in segment.turns] == [
        tuple(ids) for ids in server.sampled_ids]  # exactly what the model sampled
    run_dir = tmp_path / "run"
    RunDir(run_dir).prepare(RunRecord(1, {"inference": {"model": "smollm2-135m"}}))
    store = TrajectoryStore(run_dir, writable=True)
    store.append([trajectory])
    store.close()
    result = run("eval", str(run_dir))
    assert result.returncode == 0 and "reward mean 1.000" in result.stdout, result.stdout


# ---- the OpenHands SDK agent --------------------------------------------------------------

def terminal(command: str) -> str:
    return (f"Running it.\n<function=sandbox_terminal>\n<parameter=command>{command}"
            "</parameter>\n</function>")


async def test_openhands_sdk_agent_solves_a_task_in_our_sandbox(tokenizer):
    from skyrl_agent.agents.blackbox.openhands_sdk import OpenHandsSdkAgent

    finish = "<function=finish>\n<parameter=message>done</parameter>\n</function>"
    script = replies(terminal(HELLO), terminal("cat /app/greeting.txt"), finish)
    trajectory, prompts = await scripted(OpenHandsSdkAgent(max_turns=6), "demo/hello-file",
                                         script, tokenizer)
    assert trajectory.reward.value == 1.0, trajectory
    assert trajectory.finish_reason == FinishReason.STOP
    (segment,) = trajectory.segments
    assert len(segment.turns) == 3 and segment.is_token_consistent()
    assert "Hello from the terminal!" in prompts[2].rsplit("<|im_start|>assistant", 2)[-2]


async def test_openhands_sdk_agent_runs_demo_tasks_on_the_embedded_model(server_url, tokenizer):
    from skyrl_agent.agents.blackbox.openhands_sdk import OpenHandsSdkAgent

    settings = SessionConfig(max_tokens=24, max_context_tokens=8192)
    await embedded(OpenHandsSdkAgent(max_turns=3), ["demo/hello-file", "demo/word-count"],
                   server_url, tokenizer, settings)
