"""TrajectoryStore: Parquet round trip, crash recovery, resume after kill -9, damaged shards."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from skyrl_agent.atomic import staging_path
from skyrl_agent.data.store import StoreError, TrajectoryStore
from skyrl_agent.types import FinishReason, Reward, Segment, Trajectory, Turn


def make_trajectory(task: str, index: int, reward: float = 1.0) -> Trajectory:
    turn = Turn(prompt_ids=(1, 2, 3), completion_ids=(4, 5), completion_logprobs=(-0.5, -0.25),
                loss_mask=(1, 1), policy_version=2, finish_reason=FinishReason.STOP,
                started_at=10.0, latency_s=0.5, token_policy_versions=(2, 3))
    follow = Turn(prompt_ids=(1, 2, 3, 4, 5, 6), completion_ids=(7,),
                  completion_logprobs=(-1.0,), loss_mask=(1,), policy_version=3,
                  finish_reason=FinishReason.LENGTH)
    return Trajectory(task_id=task, sample_index=index, agent="terminus",
                      segments=(Segment((turn, follow), 1), Segment((follow,))),
                      reward=Reward(reward, {"tests": reward, "style": 0.5}),
                      finish_reason=FinishReason.STOP, metrics={"turns": 3, "drift_tokens": 0})


def test_round_trip_is_exact(tmp_path):
    store = TrajectoryStore(tmp_path, writable=True)
    originals = [make_trajectory("demo/a", i) for i in range(3)]
    store.append(originals[:2])
    store.append(originals)  # the first two are already stored: only one new row
    assert store.load().trajectories == originals
    store.compact()
    assert len(list((tmp_path / "trajectories").glob("shard-*"))) == 1
    store.close()
    assert TrajectoryStore(tmp_path).load().trajectories == originals
    table = pq.read_table(next((tmp_path / "trajectories").glob("shard-*")))
    assert str(table.schema.field("segments").type).count("list<element: int32>") >= 2


def test_datasets_reads_the_shards(tmp_path):
    import datasets

    store = TrajectoryStore(tmp_path, writable=True)
    store.append([make_trajectory("demo/a", 0)])
    files = [str(p) for p in (tmp_path / "trajectories").glob("shard-*.parquet")]
    loaded = datasets.load_dataset("parquet", data_files=files, split="train")
    assert loaded[0]["segments"][0]["turns"][0]["completion_ids"] == [4, 5]
    # Metrics and reward components arrive as numbers, not as JSON text to parse.
    assert {e["name"]: e["value"] for e in loaded[0]["metrics"]} == {"turns": 3.0,
                                                                      "drift_tokens": 0.0}
    frame = pq.read_table(files[0]).to_pandas()
    assert [e["value"] for e in frame["reward_components"][0]] == [1.0, 0.5]


def test_a_shard_missing_from_the_index_is_adopted_or_dropped(tmp_path):
    store = TrajectoryStore(tmp_path, writable=True)
    store.append([make_trajectory("demo/a", 0)])
    shard = store.append([make_trajectory("demo/a", 1)])
    index = tmp_path / "trajectories" / "index.jsonl"
    lines = [ln for ln in index.read_text().splitlines() if shard.name not in ln]
    index.write_text("".join(f"{ln}\n" for ln in lines))  # crashed between shard and index
    store.close()
    store = TrajectoryStore(tmp_path, writable=True)
    assert len(store) == 2
    store.compact()
    merged = next((tmp_path / "trajectories").glob("shard-*"))
    duplicate = merged.with_name("shard-999999-dup.parquet")  # an interrupted compaction
    duplicate.write_bytes(merged.read_bytes())
    store.close()
    store = TrajectoryStore(tmp_path, writable=True)
    assert len(store) == 2 and not duplicate.exists()


def test_damaged_shard_is_named_and_others_still_read(tmp_path):
    store = TrajectoryStore(tmp_path, writable=True)
    store.append([make_trajectory("demo/a", 0)])
    bad = store.append([make_trajectory("demo/b", 0)])
    store.close()
    bad.write_bytes(b"PAR1 this is not parquet")
    contents = TrajectoryStore(tmp_path).load()
    assert [t.task_id for t in contents.trajectories] == ["demo/a"]
    assert len(contents.problems) == 1 and bad.name in contents.problems[0]
    with pytest.raises(StoreError, match="not a run directory"):
        TrajectoryStore(tmp_path / "nowhere")


def test_a_damaged_first_shard_hides_none_after_it(tmp_path):
    """Stops: reading stopping at the first unreadable shard, which would drop every
    trajectory in the shards after it (shards are read in name order)."""
    store = TrajectoryStore(tmp_path, writable=True)
    bad = store.append([make_trajectory("demo/a", 0)])
    store.append([make_trajectory("demo/b", 0)])
    store.append([make_trajectory("demo/c", 0)])
    store.close()
    bad.write_bytes(b"PAR1 this is not parquet")
    contents = TrajectoryStore(tmp_path).load()
    assert [t.task_id for t in contents.trajectories] == ["demo/b", "demo/c"]
    assert len(contents.problems) == 1 and bad.name in contents.problems[0]


def test_a_new_run_dir_is_made_with_its_parents(tmp_path):
    run_dir = tmp_path / "runs" / "new" / "run"
    store = TrajectoryStore(run_dir, writable=True)
    store.append([make_trajectory("demo/a", 0)])
    store.close()
    assert [t.task_id for t in TrajectoryStore(run_dir).load().trajectories] == ["demo/a"]


def test_a_damaged_index_line_before_the_last_is_named(tmp_path):
    """Only the last line may be torn (a crash mid-append); one before it is corruption, named
    by file and line, never silently dropped."""
    store = TrajectoryStore(tmp_path, writable=True)
    store.append([make_trajectory("demo/a", 0)])
    store.append([make_trajectory("demo/b", 0)])
    store.close()
    index = next(tmp_path.rglob("index.jsonl"))
    lines = index.read_text().splitlines()
    index.write_text("\n".join(["{not json", *lines[1:]]) + "\n")
    with pytest.raises(StoreError, match=r"index\.jsonl is corrupted at line 1: "):
        TrajectoryStore(tmp_path)


def test_one_writer_at_a_time(tmp_path):
    first = TrajectoryStore(tmp_path, writable=True)
    with pytest.raises(StoreError, match="another process"):
        TrajectoryStore(tmp_path, writable=True)
    first.close()


def test_a_torn_last_index_line_is_repaired_and_appending_goes_on(tmp_path):
    store = TrajectoryStore(tmp_path, writable=True)
    store.append([make_trajectory("demo/a", 0)])
    store.append([make_trajectory("demo/a", 1)])
    store.close()
    index = tmp_path / "trajectories" / "index.jsonl"
    text = index.read_text()
    index.write_text(text[:-9])  # a crash in the middle of the last line
    assert TrajectoryStore(tmp_path).keys() == {("demo/a", 0)}  # readers skip the torn line
    store = TrajectoryStore(tmp_path, writable=True)  # the writer adopts its shard again
    store.append([make_trajectory("demo/a", 2)])
    store.close()
    assert TrajectoryStore(tmp_path).keys() == {("demo/a", 0), ("demo/a", 1), ("demo/a", 2)}


def test_append_adds_one_index_line_and_never_a_held_key(tmp_path):
    """The index grows by one line per shard (no rewrite per append), and a key already held
    is not written again (load() de-duplicating would hide that)."""
    store = TrajectoryStore(tmp_path, writable=True)
    store.append([make_trajectory("demo/a", 0)])
    assert store.append([make_trajectory("demo/a", 0)]) is None
    store.append([make_trajectory("demo/a", 0), make_trajectory("demo/a", 1)])
    index = tmp_path / "trajectories" / "index.jsonl"
    assert len(index.read_text().splitlines()) == 2
    rows = sum(pq.read_metadata(p).num_rows
               for p in (tmp_path / "trajectories").glob("shard-*.parquet"))
    assert rows == 2


def test_compact_never_folds_away_a_damaged_shard(tmp_path):
    """Stops: compact() merging only the readable shards and deleting the rest (data loss).
    With a shard it cannot read, compaction leaves every shard and the index as they are."""
    store = TrajectoryStore(tmp_path, writable=True)
    store.append([make_trajectory("demo/a", 0)])
    bad = store.append([make_trajectory("demo/b", 0)])
    store.append([make_trajectory("demo/c", 0)])
    store.close()
    bad.write_bytes(b"PAR1 damaged on disk")
    index = tmp_path / "trajectories" / "index.jsonl"
    before = sorted(p.name for p in (tmp_path / "trajectories").glob("shard-*.parquet"))
    indexed = index.read_text()
    store = TrajectoryStore(tmp_path, writable=True)
    store.compact()
    store.close()
    assert sorted(p.name for p in (tmp_path / "trajectories").glob("shard-*.parquet")) == before
    assert bad.read_bytes() == b"PAR1 damaged on disk" and index.read_text() == indexed
    assert TrajectoryStore(tmp_path).keys() == {("demo/a", 0), ("demo/b", 0), ("demo/c", 0)}


def test_temporary_files_are_removed_when_opened_for_writing(tmp_path):
    """Stops: the staging of a crashed write (a half-written shard or index) being kept after
    the store is opened for writing again. A reader leaves the folder alone."""
    store = TrajectoryStore(tmp_path, writable=True)
    store.append([make_trajectory("demo/a", 0)])
    store.close()
    folder = tmp_path / "trajectories"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    leftovers = [staging_path(folder / name, pid=dead.pid)
                 for name in ("shard-000001-deadbeef.parquet", "index.jsonl")]
    for leftover in leftovers:
        leftover.write_bytes(b"half written")
    assert TrajectoryStore(tmp_path).keys() == {("demo/a", 0)}
    assert all(leftover.exists() for leftover in leftovers)
    store = TrajectoryStore(tmp_path, writable=True)
    assert not any(leftover.exists() for leftover in leftovers)
    assert store.keys() == {("demo/a", 0)}
    store.close()


@pytest.mark.slow
def test_kill_9_then_resume_loses_and_duplicates_nothing(tmp_path):
    run_dir = tmp_path / "run"
    command = [sys.executable, "-c", "from skyrl_agent.cli import main; main()", "rollout",
               "--agent", "oracle", "--tasks", "demo", "--n", "3", "-j", "2",
               "--output", str(run_dir)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    index = run_dir / "trajectories" / "index.jsonl"
    deadline = time.monotonic() + 240
    stored_before_kill = 0
    while time.monotonic() < deadline and process.poll() is None:
        if index.exists():
            lines = index.read_text().splitlines()
            stored_before_kill = sum(len(json.loads(ln)["keys"]) for ln in lines
                                     if ln.endswith("}"))
        if stored_before_kill >= 6:
            break
        time.sleep(0.05)
    assert process.poll() is None, "the run finished before it could be killed"
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert 6 <= stored_before_kill < 39
    resumed = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    store = TrajectoryStore(run_dir)
    trajectories = store.load().trajectories
    keys = [(t.task_id, t.sample_index) for t in trajectories]
    assert len(keys) == len(set(keys)) == 39
    rows = sum(pq.read_metadata(p).num_rows
               for p in (run_dir / "trajectories").glob("shard-*.parquet"))
    assert rows == 39  # no duplicate rows on disk either
    assert all(t.reward.value == 1.0 for t in trajectories)


def test_every_dataclass_field_has_a_column():
    # The Parquet schema is written by hand: a field added to Turn, Segment or Trajectory
    # without a column (or a column left over after a field went) fails here.
    import dataclasses

    from skyrl_agent.data.schema import DERIVED_COLUMNS, SCHEMA, SEGMENT, TURN

    def names(struct) -> set[str]:
        return {struct.field(i).name for i in range(struct.num_fields)}

    reward_columns = {"reward", "reward_components", "reward_reason"}  # Reward, flattened
    trajectory = {f.name for f in dataclasses.fields(Trajectory)} - {"reward"} | reward_columns
    assert set(SCHEMA.names) == trajectory | set(DERIVED_COLUMNS)
    # prompt_shared is how much of its prompt a turn takes from the previous one (schema.py).
    assert names(TURN) == {f.name for f in dataclasses.fields(Turn)} | {"prompt_shared"}
    assert names(SEGMENT) == {f.name for f in dataclasses.fields(Segment)}
    # Reward's fields: value, components, reason as the reward_* columns; verify_time_s is read
    # back from the trajectory's column of that name.
    assert {f.name for f in dataclasses.fields(Reward)} == {
        "value", "components", "reason", "verify_time_s"}


def _raw_turns(path):
    return [turn for row in pq.read_table(path).to_pylist() for segment in row["segments"]
            for turn in segment["turns"]]


def test_a_turn_stores_only_the_prompt_ids_it_adds(tmp_path):
    base = make_trajectory("demo/a", 0)
    turn, follow = base.segments[0].turns
    rewritten = Turn(prompt_ids=(9, 9), completion_ids=(8,), completion_logprobs=(-1.0,),
                     loss_mask=(1,), policy_version=3, finish_reason=FinishReason.STOP)
    trajectory = Trajectory("demo/a", 0, "terminus", (Segment((turn, follow, rewritten)),),
                            Reward(1.0), FinishReason.STOP)
    store = TrajectoryStore(tmp_path, writable=True)
    shard = store.append([trajectory])
    stored = [(t["prompt_shared"], t["prompt_ids"]) for t in _raw_turns(shard)]
    # The first turn and one that does not extend the history are whole; a follow-up is not.
    assert stored == [(0, [1, 2, 3]), (5, [6]), (0, [9, 9])]
    assert store.load().trajectories == [trajectory]


def test_a_shard_of_whole_prompts_reads_the_same(tmp_path):
    import pyarrow as pa

    from skyrl_agent.data import schema

    def without_shared(struct_type):  # the schema as it was before prompts were shared
        fields = [f for f in struct_type if f.name != "prompt_shared"]
        return pa.struct([pa.field(f.name, _old(f.type)) for f in fields])

    def _old(kind):
        if pa.types.is_list(kind):
            return pa.list_(_old(kind.value_type))
        return without_shared(kind) if pa.types.is_struct(kind) else kind

    old_schema = pa.schema([pa.field(f.name, _old(f.type)) for f in schema.SCHEMA])
    trajectory = make_trajectory("demo/a", 0)
    row = schema.to_row(trajectory)
    for segment, original in zip(row["segments"], trajectory.segments, strict=True):
        for turn, whole in zip(segment["turns"], original.turns, strict=True):
            turn["prompt_ids"] = list(whole.prompt_ids)
            del turn["prompt_shared"]
    store = TrajectoryStore(tmp_path, writable=True)
    shard = store.append([make_trajectory("demo/b", 0)])
    pq.write_table(pa.Table.from_pylist([row], schema=old_schema), shard)  # in its place
    assert "prompt_shared" not in str(pq.read_table(shard).schema)
    assert store.load().trajectories == [trajectory]


def test_a_turn_claiming_more_history_than_there_is_names_its_shard(tmp_path):
    import pyarrow as pa

    from skyrl_agent.data import schema

    store = TrajectoryStore(tmp_path, writable=True)
    store.append([make_trajectory("demo/a", 0)])
    bad = store.append([make_trajectory("demo/b", 0)])
    row = schema.to_row(make_trajectory("demo/b", 0))
    row["segments"][0]["turns"][1]["prompt_shared"] = 99
    pq.write_table(pa.Table.from_pylist([row], schema=schema.SCHEMA), bad)
    contents = store.load()
    assert [t.task_id for t in contents.trajectories] == ["demo/a"]
    assert len(contents.problems) == 1 and bad.name in contents.problems[0]
