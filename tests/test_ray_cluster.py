"""`train --ray` on a Ray cluster of several machines (Docker containers: tests/ray_cluster.py):
the trainer's ranks run on other nodes than its driver, a worker node killed mid-run stops the
run in one line, and `--resume` goes on, on the nodes that are left, losing and repeating
nothing."""

from __future__ import annotations

import time

import pytest

from skyrl_agent.data.store import TrajectoryStore
from skyrl_agent.rl.checkpoints import Checkpoints
from skyrl_agent.rl.metrics import read_metrics
from tests.test_train import assert_nothing_lost_or_repeated
from tests.tiny_models import char_model_dir

pytestmark = [pytest.mark.docker, pytest.mark.slow]
pytest.importorskip("ray")
pytest.importorskip("megatron.core")

RANK, COLLECTOR = "ray::RankActor", "ray::CollectorActor"
"""The titles Ray gives a rank actor's and a collector actor's processes."""


# About 2 minutes. It took up to 6 when a run's end cancelled sandboxes still starting in a node
# (no cgroups there) and their stop waited for the sandbox's lifetime: fixed in local_kill.py,
# held by tests/test_sandbox_stop.py. The limit leaves room for a loaded machine.
@pytest.mark.timeout(600)
def test_a_worker_node_killed_mid_run_stops_it_and_resume_goes_on_exactly(tmp_path):
    """Stops: ranks that never leave the driver's node, a lost node that leaves the run waiting
    for its rank forever (or ends it in a traceback), and a resume that repeats or loses steps."""
    from tests.ray_cluster import ray_cluster

    shared = tmp_path / "shared"
    model = char_model_dir(shared / "model")
    run_dir = shared / "run"
    placement = ["--ray", "auto", "--set", "ray.collectors=2", "--set", "ray.trainer_cpus=1",
                 "--set", "ray.server_cpus=1", "--set", "ray.rank_cpus=1",
                 "--set", "sandbox.work_root=/tmp/sandboxes"]
    train = ["skyrl-agent", "train", "--output", str(run_dir), *placement]
    # The head holds the driver, the trainer actor, one server and rank 0 (3 CPUs: full); the
    # other Megatron rank must go to a worker.
    run = ["--agent", "answer", "--tasks", "toy", "--n", "4", "--set", "inference.max_tokens=8",
           "--set", "inference.num_servers=1", "--set", "trainer.groups_per_step=2",
           "--set", "trainer.backend=megatron", "--set", "trainer.tensor_parallel=2"]
    with ray_cluster(shared, head_cpus=3, workers=2) as cluster:
        # A model only the head has: the parts on the workers (a collector's tokenizer, rank 1)
        # cannot load it, and the run says so in one line.
        lonely = "/tmp/model-on-the-head-only"
        assert cluster.head.exec(["cp", "-r", str(model), lonely])[0] == 0
        refused = cluster.start(cluster.head, [
            "skyrl-agent", "train", "--output", str(shared / "refused"), *placement, *run,
            "--steps", "1", "--set", f"inference.model={lonely}"], shared / "refused.log")
        assert refused.wait(300) == 1, refused.output()
        [stopped] = [line for line in refused.output().splitlines() if "stopped:" in line]
        assert lonely in stopped, stopped
        assert "Traceback" not in refused.output()

        first = cluster.start(cluster.head, [
            *train, *run, "--steps", "5", "--set", f"inference.model={model}",
            "--set", "trainer.learning_rate=3e-2", "--set", "trainer.checkpoint_every=1",
        ], shared / "first.log")
        _wait_for(lambda: (Checkpoints(run_dir).latest() or run_dir).name >= "step-000002",
                  first, 600)
        hosts = [node for node in cluster.workers if cluster.running(node, RANK)]
        assert len(hosts) == 1 and cluster.running(cluster.head, RANK) == 1, first.output()
        # The collectors (and so the sandboxes) go to the workers, one each, not the busy head.
        assert all(cluster.running(node, COLLECTOR) for node in cluster.workers), first.output()
        hosts[0].get_wrapped_container().kill()

        assert first.wait(240) == 1, first.output()
        # One line of ours (Ray goes on to print the lost node's own log after it).
        [stopped] = [line for line in first.output().splitlines() if "stopped:" in line]
        assert "lost" in stopped or "died" in stopped, stopped
        assert "--resume" in stopped and "Traceback" not in first.output()
        stored_before = len(TrajectoryStore(run_dir).load().trajectories)

        # The run goes on on the nodes that are left: rank 1 now on the other worker.
        [survivor] = [node for node in cluster.workers if node is not hosts[0]]
        resumed = cluster.start(cluster.head, [*train, "--resume"], shared / "resumed.log")
        _wait_for(lambda: cluster.running(survivor, RANK) == 1, resumed, 600)
        assert resumed.wait(600) == 0, resumed.output()
        assert "resume from" in resumed.output()

    assert_nothing_lost_or_repeated(run_dir, steps=5, groups=10, stored_before=stored_before)
    steps = [row["step"] for row in read_metrics(run_dir)]
    assert sorted(set(steps)) == list(range(5))
    on_policy = [r["agreement/max_abs_diff"] for r in read_metrics(run_dir)
                 if "agreement/max_abs_diff" in r]
    assert on_policy and max(on_policy) < 1e-3  # ranks on two machines compute what was sampled


def _wait_for(condition, command, timeout: float) -> None:
    """Until `condition` holds, while `command` runs."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert command.returncode is None, command.output()
        assert time.monotonic() < deadline, command.output()[-3000:]
        time.sleep(0.5)
