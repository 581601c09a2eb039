"""Demonstrations: reference solutions acted out by Terminus and CodeAct through real sessions
and sandboxes. Every stored one replays to reward 1 from its own ids and passes the token checks
of sampled trajectories; rejection sampling keeps only rewarded, consistent samples."""

from __future__ import annotations

import asyncio

import pytest
from transformers import AutoTokenizer

from skyrl_agent.agents.teacher import TEACHER_LOGPROB
from skyrl_agent.agents.terminus.parsing import parse_reply
from skyrl_agent.collector.demos import replay, token_problem
from skyrl_agent.config import load_config
from skyrl_agent.data.run_dir import RunDir, RunRecord
from skyrl_agent.data.store import TrajectoryStore
from skyrl_agent.errors import UserError
from skyrl_agent.jobs.demos import DemoJob, keep_rewarded
from skyrl_agent.llm.tool_calls import parse_tool_calls
from skyrl_agent.rl.batch import sft_data
from skyrl_agent.rl.sft import plan_sft
from skyrl_agent.tasks import resolve_tasks
from skyrl_agent.tasks.families import FAMILIES
from skyrl_agent.tasks.solution import solution_commands, solution_walkthrough
from skyrl_agent.types import FinishReason, Reward, Segment, Trajectory, Turn
from tests.test_cli import assert_one_line_error, run

pytestmark = pytest.mark.slow
ONE_TURN = ",".join(name for name, fam in FAMILIES.items() if not fam.generate(0).blueprint.steps)
SOURCES = {"terminus": f"gen:{ONE_TURN}:train:1",
           "openhands": "gen:count,git-commit@3,fix-bug:train:1"}
"""Families solved in one turn (the long-horizon ones have walkthroughs, tested below)."""
LONG = "gen:follow-clues@2,follow-clues@3:train:1"


def _config(agent: str, *more: str):
    return load_config(None, [f"agent.name={agent}", f"tasks.source={SOURCES[agent]}",
                              "collector.max_concurrent_sandboxes=4", *more])


@pytest.fixture(scope="module", params=["terminus", "openhands"])
def demo_run(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"demos-{request.param}")
    config = _config(request.param)
    job = DemoJob(config, root / "run")
    try:
        outcomes = asyncio.run(job.run())
    finally:
        job.close()
    return request.param, config, root / "run", outcomes


def test_every_task_gets_a_kept_demonstration(demo_run):
    agent, config, run_dir, outcomes = demo_run
    assert [(o.task, o.kept, o.reason) for o in outcomes] == \
        [(t.name, True, None) for t in resolve_tasks(SOURCES[agent])]
    again = DemoJob(config, run_dir)  # the same command on the same run dir: nothing left
    try:
        assert again.pending == []
    finally:
        again.close()
    assert RunDir(run_dir).record().section("agent", "name") == agent


def test_stored_demonstrations_are_token_exact_trajectories(demo_run, smollm2_dir):
    agent, _, run_dir, _ = demo_run
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    stored = TrajectoryStore(run_dir).load().trajectories
    tasks = {t.name: t for t in resolve_tasks(SOURCES[agent])}
    assert {t.task_id for t in stored} == set(tasks)
    for trajectory in stored:
        assert trajectory.reward.value == 1.0 and not trajectory.masked
        assert token_problem(trajectory) is None and len(trajectory.segments) == 1
        assert trajectory.metrics["demonstration"] == 1.0
        turns = trajectory.segments[0].turns
        assert len(turns) == 2 and trajectory.finish_reason == FinishReason.STOP
        for turn in turns:
            assert set(turn.loss_mask) == {1} and turn.policy_version == 0
            assert set(turn.completion_logprobs) == {TEACHER_LOGPROB}
            assert turn.completion_ids[-1] == tokenizer.eos_token_id
        first = tokenizer.decode(list(turns[0].completion_ids), skip_special_tokens=True)
        commands = solution_commands(tasks[trajectory.task_id])
        if agent == "terminus":
            assert parse_reply(first).commands[0].keystrokes == "".join(f"{c}\n" for c in commands)
        else:
            [call] = parse_tool_calls(first)
            assert call.name == "execute_bash" and call.arguments["command"] == "\n".join(commands)
        [datum] = sft_data([trajectory])
        assert datum.num_loss_tokens == sum(len(t.completion_ids) for t in turns)
        full = turns[-1].prompt_ids + turns[-1].completion_ids
        assert (*datum.model_input, int(datum.loss_fn_inputs["target_tokens"][-1])) == full


def test_every_stored_demonstration_replays_to_reward_one(demo_run, smollm2_dir):
    _, config, run_dir, _ = demo_run
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    stored = TrajectoryStore(run_dir).load().trajectories
    tasks = {t.name: t for t in resolve_tasks(config.tasks.source)}

    async def replay_all():
        return await asyncio.gather(*(replay(t, tasks[t.task_id], config, tokenizer)
                                      for t in stored))

    for before, after in zip(stored, asyncio.run(replay_all()), strict=True):
        assert after.reward.value == 1.0, (after.task_id, after.reward, after.mask_reason)
        assert [t.completion_ids for t in after.segments[0].turns] == \
            [t.completion_ids for t in before.segments[0].turns]
        assert token_problem(after) is None


@pytest.mark.parametrize("agent", ["terminus", "openhands"])
def test_a_walkthrough_is_summarized_across_segments_and_replays(agent, tmp_path, smollm2_dir):
    """Stops: a teacher that answers a summary request with the next step (the script would
    run out of replies), a summary that loses what earlier segments found (each must hold the
    `carry` of every step whose output the model had seen), a long-horizon task demonstrated
    without filling the 2,048-token context, and a summarized demonstration that does not
    replay from its own ids."""
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    config = load_config(None, [f"agent.name={agent}", f"tasks.source={LONG}",
                                "agent.max_context_tokens=2048", "agent.max_turns=30",
                                "collector.max_concurrent_sandboxes=4"])
    job = DemoJob(config, tmp_path / "run")
    try:
        outcomes = asyncio.run(job.run())
    finally:
        job.close()
    assert [(o.kept, o.reason) for o in outcomes] == [(True, None)] * 2
    tasks = {t.name: t for t in resolve_tasks(LONG)}
    stored = TrajectoryStore(tmp_path / "run").load().trajectories
    for trajectory in stored:
        assert len(trajectory.segments) >= 2 and token_problem(trajectory) is None
        steps = solution_walkthrough(tasks[trajectory.task_id])
        replies = 0
        for segment in trajectory.segments[:-1]:
            replies += len(segment.turns) - 1
            summary = tokenizer.decode(list(segment.turns[segment.summary_turn_index]
                                            .completion_ids), skip_special_tokens=True)
            assert segment.summary_turn_index == len(segment.turns) - 1
            assert [s.carry for s in steps[:replies - 1] if s.carry in summary] == \
                [s.carry for s in steps[:replies - 1]]
            assert steps[replies - 1].commands[0] in summary

    async def replay_all():
        return await asyncio.gather(*(replay(t, tasks[t.task_id], config, tokenizer)
                                      for t in stored))

    for before, after in zip(stored, asyncio.run(replay_all()), strict=True):
        assert after.reward.value == 1.0 and token_problem(after) is None
        assert [[t.completion_ids for t in s.turns] for s in after.segments] == \
            [[t.completion_ids for t in s.turns] for s in before.segments]


def test_a_reply_past_the_token_budget_is_dropped(tmp_path):
    config = _config("terminus", "inference.max_tokens=40", "tasks.limit=2")
    job = DemoJob(config, tmp_path / "run")
    try:
        outcomes = asyncio.run(job.run())
    finally:
        job.close()
    assert [o.reason for o in outcomes] == ["a reply is longer than inference.max_tokens"] * 2
    assert len(TrajectoryStore(tmp_path / "run")) == 0
    assert not (tmp_path / "run" / "final_state").exists() or \
        not any((tmp_path / "run" / "final_state").iterdir())


def _trajectory(task: str, index: int, reward: float, masked: bool = False,
                consistent: bool = True) -> Trajectory:
    first = Turn((1, 2, 3), (4, 5), (-0.5, -0.25), (1, 1), 0, FinishReason.STOP)
    second = Turn((1, 2, 3, 4, 5, 6) if consistent else (9, 9), (7,), (-0.125,), (1,), 0,
                  FinishReason.STOP)
    return Trajectory(task, index, "terminus", (Segment((first, second)),), Reward(reward),
                      FinishReason.STOP, masked=masked, mask_reason="timeout" if masked else None)


def test_rejection_sampling_keeps_rewarded_consistent_samples_only(tmp_path):
    source = tmp_path / "source"
    RunDir(source).prepare(RunRecord(n=4, config={"inference": {"model": "smollm2-135m"}}))
    samples = [_trajectory("gen/count-d1-0", 0, 1.0), _trajectory("gen/count-d1-0", 1, 0.5),
               _trajectory("gen/count-d1-0", 2, 1.0, masked=True),
               _trajectory("gen/count-d1-0", 3, 1.0, consistent=False),
               _trajectory("gen/count-d1-1", 0, 1.0)]
    store = TrajectoryStore(source, writable=True)
    store.append(samples)
    store.close()
    state = RunDir(source).state_path("gen/count-d1-0", 0)
    state.parent.mkdir(parents=True)
    state.write_bytes(b"bundle")
    result = keep_rewarded(source, tmp_path / "kept")
    assert (result.kept, result.total) == (2, 5)
    assert result.reasons == {"reward below the minimum": 1, "masked: timeout": 1,
                              "segment 0: a prompt does not extend the turn before it": 1}
    kept = TrajectoryStore(tmp_path / "kept").load().trajectories
    assert [(t.task_id, t.sample_index) for t in kept] == [("gen/count-d1-0", 0),
                                                          ("gen/count-d1-1", 0)]
    assert kept[0] == samples[0]  # token for token
    assert RunDir(tmp_path / "kept").state_path("gen/count-d1-0", 0).read_bytes() == b"bundle"
    assert RunDir(tmp_path / "kept").record() == RunDir(source).record()
    assert keep_rewarded(source, tmp_path / "half", min_reward=0.5).kept == 3
    with pytest.raises(UserError, match="different run dirs"):
        keep_rewarded(source, source)


def test_sft_refuses_data_holding_held_out_tasks(tmp_path):
    run_dir = tmp_path / "leaky"
    RunDir(run_dir).prepare(RunRecord(n=1, config={}))
    store = TrajectoryStore(run_dir, writable=True)
    store.append([_trajectory("gen/count-d1-3", 0, 1.0), _trajectory("gen/count-d1-10003", 0, 1.0)])
    store.close()
    with pytest.raises(UserError, match="held-out tasks"):
        plan_sft(load_config(None, []), run_dir, None, 1, 1)


def test_demos_cli_refuses_bad_input_with_one_line(tmp_path):
    assert_one_line_error(run("demos", "--agent", "answer", "--output", str(tmp_path / "a")),
                          "cannot act out")
    assert_one_line_error(run("demos", "--from", str(tmp_path / "none"), "--output",
                              str(tmp_path / "b")), "not a run dir")
    assert_one_line_error(run("demos", "--tasks", "gen:nope:train", "--output",
                              str(tmp_path / "c")), "unknown task family")
