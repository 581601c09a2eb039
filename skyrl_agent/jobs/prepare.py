"""The one preparation every command runs before any work.

In this order, each step failing with one line before anything is started or written:

    agent        the configured agent class, constructed once (a broken plug-in fails here)
    backend      the sandbox backend exists and accepts its name
    tasks        the task source resolved (include, limit applied)
    held-out     training commands refuse held-out generated tasks
    preflight    the backend's check that it can run these tasks
    run record   what the run dir pins, written (or checked against the one there)
    store        the run's trajectory store, held for writing
    leftovers    sandboxes left by killed runs reaped

A command says which steps it needs with a `Needs` value; the same steps always run in the same
order, so commands no longer drift apart.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skyrl_agent.agents.base import Agent, agent_class
from skyrl_agent.collector.one_sample import make_agent
from skyrl_agent.config import RunConfig
from skyrl_agent.data.run_dir import RunDir, RunRecord
from skyrl_agent.data.store import TrajectoryStore
from skyrl_agent.errors import UserError
from skyrl_agent.tasks.spec import TaskSpec

PLACEMENT: dict[str, Any] = {"collector": True, "output_dir": True, "ray": True,
                             "inference": {"num_servers"}}
"""Settings that say where and how concurrently a run's parts work, not what they sample or
train: a run dir does not pin them."""


@dataclass(frozen=True)
class Needs:
    """The preparation steps a command needs beyond the backend check, preflight and the
    reaping of leftovers, which every command that starts sandboxes gets."""

    agent: bool = True
    """Resolve and construct the configured agent (config.agent.name)."""
    model: bool = False
    """The agent must call the model (training has nothing to train otherwise)."""
    tasks: bool = True
    """Resolve config.tasks (commands that copy a stored run have none)."""
    training: bool = False
    """Refuse held-out generated tasks."""
    run_dir: bool = False
    """Write (or check) the run record in the output folder."""
    store: bool = False
    """Open the run's trajectory store for writing (needs run_dir)."""
    sandboxes: bool = True
    """The command starts sandboxes: backend check, preflight, leftovers reaped."""


ROLLOUT = Needs(run_dir=True, store=True)
DEMOS = Needs(run_dir=True, store=True)
TRAIN = Needs(model=True, training=True)
"""A training run's dir is written by its job once every part has started (a run that cannot
start leaves nothing behind), and its store is opened where its collectors run."""
REFERENCE = Needs(model=True, training=True, run_dir=True)
"""The reference loop in one sitting: its store is opened where its collector runs."""
CHECK = Needs(agent=False)
"""`tasks check` and `tasks audit` run model-free agents named on their command line."""
COPY = Needs(agent=False, tasks=False, run_dir=True, store=True, sandboxes=False)
"""Rejection sampling: a stored run's trajectories copied into a new run dir."""


@dataclass(frozen=True)
class Prepared:
    """A command's run, validated, its run dir ready: what every job starts from."""

    agent_cls: type[Agent] | None
    """The configured agent class (None when the command names its own agents)."""
    tasks: tuple[TaskSpec, ...]
    run_dir: RunDir | None
    """The run directory (None for commands that write none)."""
    store: TrajectoryStore | None
    """The run's store, open for writing; the job closes it."""

    @property
    def agent(self) -> type[Agent]:
        """The agent class of a command whose Needs has agent=True."""
        assert self.agent_cls is not None, "this command prepared no agent"
        return self.agent_cls


def record_of(settings: RunConfig, n: int) -> RunRecord:
    """What a rollout's run dir pins: what is sampled. Concurrency, where the run dir lives and
    how a trainer would use the samples may change between a run and its resumption."""
    config = json.loads(settings.model_dump_json(exclude=PLACEMENT | {"trainer": True}))
    return RunRecord(n=n, config=config)


def train_record(config: RunConfig) -> RunRecord:
    """What a training run records: everything but where and how concurrently it runs."""
    settings = json.loads(config.model_dump_json(exclude=PLACEMENT))
    return RunRecord(n=config.collector.n_samples_per_task, config=settings)


def prepare_run(config: RunConfig, needs: Needs, output: Path | None = None,
                record: RunRecord | None = None, tasks: str | None = None) -> Prepared:
    """Every step `needs` names, in the module's order. `record` is what the run dir in
    `output` pins (record_of, train_record, or a stored run's); `tasks` is a task source that
    replaces config.tasks.source (`tasks check DIR`)."""
    from skyrl_agent.sandboxes.base import preflight, sandbox_backend
    from skyrl_agent.sandboxes.reaper import reap_leftovers
    from skyrl_agent.tasks import resolve_tasks
    from skyrl_agent.tasks.families import refuse_heldout

    agent = _agent(config, needs) if needs.agent else None
    if needs.sandboxes:
        sandbox_backend(config.sandbox.backend)
    specs: list[TaskSpec] = []
    if needs.tasks:
        source = tasks or config.tasks.source
        specs = resolve_tasks(source, config.tasks.include, config.tasks.limit)
        if needs.training:
            refuse_heldout((t.name for t in specs), f"--tasks {source}")
    if needs.sandboxes:
        preflight(specs, config.sandbox)
    run_dir = RunDir(output) if output is not None else None
    if needs.run_dir:
        if run_dir is None or record is None:
            raise ValueError("a run dir needs an output folder and the record it pins")
        run_dir.prepare(record)
    store = TrajectoryStore(run_dir.path, writable=True) if needs.store and run_dir else None
    if needs.sandboxes:
        reap_leftovers(config.sandbox)
    return Prepared(agent, tuple(specs), run_dir, store)


def _agent(config: RunConfig, needs: Needs) -> type[Agent]:
    if config.agent.name.startswith("harbor:"):  # Harbor's own agent, through its relay
        from skyrl_agent.harbor.relay_collector import relayed_agent_class

        if config.ray.address is not None:
            raise UserError("a Harbor agent (harbor:NAME) trains in one process; unset "
                            "ray.address")
        return relayed_agent_class(config.agent.name)
    agent_cls = agent_class(config.agent.name)
    make_agent(agent_cls, config)  # a broken constructor fails before any work
    if needs.model and not agent_cls.needs_model:
        raise UserError(f"agent {config.agent.name!r} never calls the model: nothing to train "
                        "(choose terminus, openhands or answer)")
    return agent_cls

