"""The generic Ray proxy (distributed/proxy.py), checked through a real Ray actor in a local
instance: every method a protocol declares crosses, nothing else does, and a method added to the
protocol crosses without a line written for it."""

from __future__ import annotations

from typing import Protocol

import pytest

from skyrl_agent.backends.backend import TrainerBackend
from skyrl_agent.distributed.proxy import Remote, Served, methods_of
from skyrl_agent.rl.workers import ServerControl

ray = pytest.importorskip("ray")


class Counter(Protocol):
    def add(self, amount: int) -> int: ...


class Counting(Counter, Protocol):
    def total(self) -> int: ...


class Tally:
    def __init__(self) -> None:
        self.sum = 0

    def add(self, amount: int) -> int:
        self.sum += amount
        return self.sum

    def total(self) -> int:
        return self.sum

    def reset(self) -> None:  # not in the protocol: never reachable through the proxy
        self.sum = 0


class TallyActor(Served):
    def __init__(self) -> None:
        self.serve(Tally(), Counting)


def test_the_protocols_methods_are_what_crosses():
    assert methods_of(TrainerBackend) == {
        "forward", "forward_backward", "optim_step", "save_state", "load_state",
        "save_weights_for_sampler", "export", "close"}
    assert methods_of(ServerControl) == {"pause", "resume", "send", "busy_seconds"}
    assert methods_of(Counting) == {"add", "total"}  # inherited methods included


@pytest.mark.slow
def test_a_remote_object_answers_its_protocol_and_refuses_the_rest():
    ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR")
    try:
        actor = ray.remote(TallyActor).options(num_cpus=0).remote()
        tally = Remote(actor, Counting, ray.get)
        assert tally.add(2) == 2 and tally.add(3) == 5 and tally.total() == 5
        with pytest.raises(AttributeError, match="reset"):
            tally.reset()
        with pytest.raises(ray.exceptions.RayTaskError, match="reset"):
            ray.get(actor.call.remote("reset"))  # the actor refuses it too
        assert tally.total() == 5
    finally:
        ray.shutdown()
