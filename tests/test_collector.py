"""The Collector over real local sandboxes: bounds, overlap, retries, failure policy, groups."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from skyrl_agent import plugins
from skyrl_agent.agents.oracle import OracleAgent
from skyrl_agent.collector.collector import Collector
from skyrl_agent.config import RunConfig
from skyrl_agent.data.store import TrajectoryStore
from skyrl_agent.sandboxes.base import SandboxError
from skyrl_agent.sandboxes.local import LocalSandbox
from skyrl_agent.tasks import resolve_tasks
from skyrl_agent.types import FinishReason

pytestmark = pytest.mark.slow
EVENTS: list[tuple[str, str, float]] = []
_ORDER = itertools.count()
FAILURES: dict[str, int] = {}


class RecordingSandbox(LocalSandbox):
    """A real local sandbox that records when it starts and stops (and can be told to fail)."""

    async def start(self) -> None:
        if FAILURES.get(self.spec.name, 0) > 0:
            FAILURES[self.spec.name] -= 1
            raise SandboxError("injected start failure")
        EVENTS.append(("start", self.spec.name, time.monotonic()))
        await super().start()
        EVENTS.append(("started", self.spec.name, time.monotonic()))

    async def stop(self) -> None:
        if self._started_at is not None:
            EVENTS.append(("stop", self.spec.name, time.monotonic()))
        await super().stop()


class SlowOracle(OracleAgent):
    """The oracle plus a pause, so agent phases are long enough to overlap with starts."""

    name = "slow-oracle"

    async def run(self, env, llm):
        EVENTS.append(("agent", env.task.name, time.monotonic()))
        # Alternately short and long, so one slot frees up while the other agent still works.
        await asyncio.sleep(0.1 if next(_ORDER) % 2 == 0 else 1.5)
        result = await super().run(env, llm)
        EVENTS.append(("agent-done", env.task.name, time.monotonic()))
        return result


@pytest.fixture(autouse=True)
def recording():
    plugins.register(plugins.SANDBOXES, "recording", RecordingSandbox)
    EVENTS.clear()
    FAILURES.clear()
    yield


def config(**collector) -> RunConfig:
    return RunConfig(sandbox={"backend": "recording"}, collector=collector)


async def test_bounds_and_overlap(tmp_path):
    tasks = resolve_tasks("demo", limit=3)
    store = TrajectoryStore(tmp_path, writable=True)
    groups = await Collector(config(max_concurrent_sandboxes=2), SlowOracle, store).run(tasks, 2)
    assert [len(g.trajectories) for g in groups] == [2, 2, 2]
    assert all(t.reward.value == 1.0 for g in groups for t in g.trajectories)
    live = peak = 0
    for kind, _, _ in sorted(EVENTS, key=lambda e: e[2]):
        live += {"start": 1, "stop": -1}.get(kind, 0)
        peak = max(peak, live)
    assert peak == 2  # never more live sandboxes than the bound, and the bound is used
    begun = [when for kind, _, when in EVENTS if kind == "agent"]
    ended = [when for kind, _, when in EVENTS if kind == "agent-done"]
    starts = [when for kind, _, when in EVENTS if kind == "start"]
    # Pipelined: some sandbox starts while another sample's agent is still working.
    agents_busy = [sum(a < s for a in begun) - sum(b < s for b in ended) for s in starts]
    assert max(agents_busy) >= 1, sorted(EVENTS, key=lambda e: e[2])
    assert len(store) == 6


async def test_infra_errors_are_retried_then_masked(tmp_path):
    tasks = resolve_tasks("demo", limit=2)
    FAILURES[tasks[0].name] = 2  # recovers on the third attempt
    FAILURES[tasks[1].name] = 99  # never starts
    store = TrajectoryStore(tmp_path, writable=True)
    groups = await Collector(config(infra_retries=2), OracleAgent, store).run(tasks, 1)
    recovered, broken = groups[0].trajectories[0], groups[1].trajectories[0]
    assert not recovered.masked and recovered.reward.value == 1.0
    assert recovered.metrics["infra_retries"] == 2
    assert broken.masked and broken.finish_reason == FinishReason.SANDBOX_ERROR
    assert "injected start failure" in broken.mask_reason and broken.metrics["infra_retries"] == 2
    assert FAILURES[tasks[1].name] == 99 - 3
    stored = {t.task_id: t for t in store.load().trajectories}
    assert stored[tasks[1].name].masked  # masked samples are stored too, with their reason


async def test_a_resumed_collector_skips_stored_samples(tmp_path):
    tasks = resolve_tasks("demo", limit=2)
    store = TrajectoryStore(tmp_path, writable=True)
    await Collector(config(), OracleAgent, store).run(tasks[:1], 2)
    EVENTS.clear()
    groups = await Collector(config(), OracleAgent, store).run(tasks, 2)
    started = [name for kind, name, _ in EVENTS if kind == "start"]
    # Two samples, each an agent's sandbox then a fresh one for verification.
    assert started == [tasks[1].name] * 4 and len(store) == 4
    assert [len(g.trajectories) for g in groups] == [2, 2]
