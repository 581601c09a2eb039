"""A training run's parts as Ray actors (`train --ray auto|local|ADDRESS`).

The same protocols as one process (rl/workers.py), each part behind an actor:

    CollectorActor x ray.collectors   sandbox fan-out: each runs groups with its own Collector
    RouterActor                       the one InferenceClient: sticky routing and load counts
                                      for every collector's sessions
    ServerActor x inference.num_servers   an embedded model server each
    TrainerActor                      the trainer backend's driver (the whole model with torch)
    RankActor x ranks                 fsdp / megatron: one trainer rank each (ranks.py)
    StoreActor                        the run's single TrajectoryStore writer

Weights travel through shared memory, so the trainer, its rank 0, the servers and the router are
placed on the driver's node; the collectors and the other ranks go wherever the cluster has room
(the ranks need the model and run dir at the same paths on every node). Imported only when a run
asks for Ray: Ray is an optional extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from skyrl_agent.errors import UserError

if TYPE_CHECKING:
    from skyrl_agent.rl.workers import Placement


def ray_placement() -> Placement:
    """The Ray placement, or one line saying how to install Ray."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise UserError("--ray needs Ray: pip install 'skyrl-agent[ray]'") from None
    from skyrl_agent.distributed.workers import ray_workers

    return ray_workers
