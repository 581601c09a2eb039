"""`train --ray`: on a local Ray cluster the run's parts are actors (collectors, servers, router,
trainer, store writer), yet the run dir is the same kind as one process's; sessions from
different actors stick to one server and are balanced by one router; the store has one writer."""

from __future__ import annotations

import asyncio
import json
import os
import time
from functools import partial
from pathlib import Path

import pytest
import torch

from skyrl_agent.config import load_config
from skyrl_agent.data.run_dir import RunDir
from skyrl_agent.data.store import TrajectoryStore
from skyrl_agent.jobs.train import TrainJob
from skyrl_agent.rl.checkpoints import Checkpoints
from skyrl_agent.rl.metrics import read_metrics
from tests.test_cli import assert_one_line_error, run
from tests.tiny_models import char_model_dir

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return char_model_dir(tmp_path_factory.mktemp("ray") / "model")


@pytest.fixture
def local_ray():
    """A local Ray instance for one test (2 CPUs; token auth off, nothing leaves the host)."""
    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield
    ray.shutdown()


def settings(model, work_root, *extra: str):
    return load_config(None, [
        "agent.name=answer", "tasks.source=toy", f"inference.model={model}",
        "inference.max_tokens=8", "collector.n_samples_per_task=4",
        "trainer.groups_per_step=2", "trainer.max_steps=2", "trainer.checkpoint_every=2",
        "trainer.learning_rate=3e-2", f"sandbox.work_root={work_root}",
        "inference.num_servers=2", "ray.collectors=2", "ray.trainer_cpus=0.5",
        "ray.server_cpus=0.5", *extra])


def _kinds(run_dir: Path) -> set[str]:
    """What a run dir holds, by kind: top-level names, checkpoint files, store file suffixes."""
    kinds = {p.name for p in run_dir.iterdir()}
    latest = Checkpoints(run_dir).latest()
    assert latest is not None
    kinds |= {f"checkpoint/{p.name}" for p in latest.iterdir()}
    kinds |= {f"trajectories/*{p.suffix}" for p in RunDir(run_dir).trajectories.iterdir()}
    return kinds


def test_a_ray_run_stores_the_same_run_dir_as_one_process(model, work_root, tmp_path,
                                                          local_ray):
    from skyrl_agent.distributed import ray_placement

    config = settings(model, work_root, "ray.address=auto")  # joins the running instance
    on_ray = asyncio.run(TrainJob(config, tmp_path / "ray", placement=ray_placement()).run())
    assert ray.is_initialized()  # a cluster the run joined is not shut down by it
    alone = asyncio.run(TrainJob(settings(model, work_root), tmp_path / "one").run())
    assert [r.step for r in on_ray] == [r.step for r in alone] == [0, 1]

    assert _kinds(tmp_path / "ray") == _kinds(tmp_path / "one")
    assert {"server-0.log", "server-1.log"} <= _kinds(tmp_path / "ray")
    assert RunDir(tmp_path / "ray").record() == RunDir(tmp_path / "one").record()

    # Every trained group is in the store, once, written by the one store actor.
    state = json.loads((Checkpoints(tmp_path / "ray").latest() / "loop.json").read_text())
    assert len(state["trained"]) == 4 and len(set(state["trained"])) == 4
    stored = TrajectoryStore(tmp_path / "ray").load().trajectories
    keys = [(t.task_id, t.sample_index) for t in stored]
    assert len(keys) == len(set(keys)) >= 4 * 4
    assert all(t.segments for t in stored if not t.masked)
    rows = read_metrics(tmp_path / "ray")
    assert [r["step"] for r in rows] == [0, 1]
    assert all(0.0 <= r["generation_idle"] <= 1.0 for r in rows)
    on_policy = [r["agreement/max_abs_diff"] for r in rows if "agreement/max_abs_diff" in r]
    assert on_policy and max(on_policy) < 1e-3  # the trainer actor computes what was sampled

    # Placement is not part of the run: the Ray run resumes in one process.
    more = settings(model, work_root, "trainer.max_steps=3")
    resumed = asyncio.run(TrainJob(more, tmp_path / "ray", resume=True).run())
    assert [r.step for r in resumed] == [2]
    state = json.loads((Checkpoints(tmp_path / "ray").latest() / "loop.json").read_text())
    assert state["step"] == 3 and len(set(state["trained"])) == len(state["trained"]) == 6

    # Nor is the backend: it goes on on Ray again, its trainer actor driving two Megatron rank
    # actors.
    megatron = settings(model, work_root, "ray.address=auto", "trainer.max_steps=4",
                        "trainer.backend=megatron", "trainer.tensor_parallel=2",
                        "ray.rank_cpus=0.25")
    again = asyncio.run(TrainJob(megatron, tmp_path / "ray", resume=True,
                                 placement=ray_placement()).run())
    assert [r.step for r in again] == [3]
    assert again[0].metrics["agreement/max_abs_diff"] < 1e-3


async def _sessions_from_two_actors(router) -> list[list[str]]:
    """Two collector-like actors open 2 sessions each at once and call the model 3 times per
    session through the router; the server of every call, per session."""
    from skyrl_agent.distributed.actors import RouterClient
    from skyrl_agent.inference.client import Sampling

    @ray.remote(num_cpus=0)
    class Caller:
        async def sessions(self, name: str) -> list[list[str]]:
            client = RouterClient(router)

            async def session(sid: str) -> list[str]:
                return [(await client.complete([5, 6, 7], Sampling(max_tokens=4),
                                               session_id=sid)).server for _ in range(3)]
            return list(await asyncio.gather(session(f"{name}-a"), session(f"{name}-b")))

    callers = [Caller.remote(), Caller.remote()]
    results = await asyncio.gather(*[c.sessions.remote(f"caller{i}")
                                     for i, c in enumerate(callers)])
    return [servers for result in results for servers in result]


def test_sessions_stick_and_balance_across_actors(model, tmp_path, local_ray):
    from skyrl_agent.config import InferenceConfig
    from skyrl_agent.distributed.actors import RouterActor, ServerActor

    inference = InferenceConfig(model=str(model))
    servers = [ray.remote(ServerActor).options(num_cpus=0).remote(inference,
                                                                  tmp_path / f"s{i}.log")
               for i in range(2)]
    urls = ray.get([s.start.remote() for s in servers])
    keys = ray.get([s.api_key.remote() for s in servers])
    router = ray.remote(RouterActor).options(num_cpus=0).remote(urls, keys)
    try:
        per_session = asyncio.run(_sessions_from_two_actors(router))
        assert len(per_session) == 4
        assert all(len(set(calls)) == 1 for calls in per_session)  # sticky
        homes = [calls[0] for calls in per_session]
        assert sorted(homes.count(u) for u in urls) == [2, 2]  # one router balances all
    finally:
        ray.get([s.stop.remote() for s in servers])


def test_a_cluster_without_room_is_refused_in_one_line(model, work_root, tmp_path,
                                                        monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    result = run("train", "--ray", "local", "--output", str(tmp_path / "run"),
                 "--set", f"inference.model={model}", "--set", "ray.trainer_cpus=64",
                 "--set", f"sandbox.work_root={work_root}", "--steps", "1")
    assert_one_line_error(result, "free CPUs", "ray.trainer_cpus")
    assert not (tmp_path / "run" / "config.json").exists()  # nothing started, nothing written


def test_rank_actors_train_like_rank_processes_and_a_lost_one_ends_the_group(model, local_ray):
    """Stops: a rendezvous that loses or mixes up keys (the group never forms, or forms wrong),
    results that differ from rank processes', rank 0 away from the servers' node (their
    shared-memory weights would be out of reach), and a dead rank actor that leaves the driver
    waiting for its peer's collective."""
    from skyrl_agent.backends.megatron.backend import MegatronBackend
    from skyrl_agent.backends.ranks import RankError
    from skyrl_agent.distributed.ranks import RayRankGroup
    from tests.test_sharded_backends import ADAM, batch

    processes = MegatronBackend(model, tensor_parallel=2, micro_batch_tokens=24)
    actors = MegatronBackend(model, tensor_parallel=2, micro_batch_tokens=24,
                             ranks=partial(RayRankGroup, cpus=0.5))
    try:
        group = actors._ranks
        here = ray.get_runtime_context().get_node_id()
        assert ray.get(group._actors[0].node_id.remote()) == here
        for step in range(2):
            expected = processes.forward_backward(batch(step), "ppo")
            got = actors.forward_backward(batch(step), "ppo")
            assert got.loss == expected.loss and got.logprobs == expected.logprobs
            assert actors.optim_step(ADAM).metrics == processes.optim_step(ADAM).metrics
        mine, theirs = actors.full_tensors("params"), processes.full_tensors("params")
        assert all(torch.equal(mine[name], theirs[name]) for name in theirs)

        ray.kill(group._actors[1])
        started = time.monotonic()
        with pytest.raises(RankError, match="trainer rank 1 was lost"):
            actors.forward(batch(3))
        assert time.monotonic() - started < 60
        with pytest.raises(RankError, match="closed"):
            actors.forward(batch(3))
    finally:
        actors.close()
        processes.close()

    # A node that cannot see the model is named in one line, before any rank loads anything.
    with pytest.raises(ValueError, match=r"rank 0 \(node .*\) cannot read the model folder"):
        RayRankGroup(2, "skyrl_agent.backends.megatron.rank:MegatronRank", "cpu",
                     {"model_folder": str(model / "elsewhere")}, cpus=0.5)


def test_collectors_go_to_the_other_nodes_first_and_wrap_around():
    """Stops: every collector (and so every sandbox) piling onto the node that trains and
    serves while other machines stand idle, which Ray's best-effort SPREAD allowed."""
    from skyrl_agent.distributed.workers import collector_nodes

    assert collector_nodes(2, "head", ["w2", "head", "w1"]) == ["w1", "w2"]
    assert collector_nodes(4, "head", ["head", "w1"]) == ["w1", "head", "w1", "head"]
    assert collector_nodes(3, "head", ["head"]) == ["head"] * 3
    # The driver's node is always a candidate, even when a stale view leaves it out.
    assert collector_nodes(2, "head", ["w1", "w1"]) == ["w1", "head"]
