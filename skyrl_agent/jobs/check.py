"""The jobs of `tasks check` (a model-free agent on tasks) and `tasks audit` (the built-in
adversaries on tasks): prepared like every command, then run by collector/check.py and
collector/audit.py."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from skyrl_agent.agents.base import agent_class
from skyrl_agent.collector.audit import AuditResult, audit_tasks, chosen_attacks
from skyrl_agent.collector.check import CheckResult, check_tasks
from skyrl_agent.config import RunConfig
from skyrl_agent.jobs.prepare import CHECK, prepare_run


class CheckJob:
    """`agent` (oracle or nop) on the tasks of `source`, at most `jobs` at once."""

    def __init__(self, settings: RunConfig, source: str, agent: str, jobs: int = 1) -> None:
        agent_class(agent)  # an unknown agent fails before any preparation
        self.settings, self.agent, self.jobs = settings, agent, jobs
        self.tasks = list(prepare_run(settings, CHECK, tasks=source).tasks)

    async def run(self, on_result: Callable[[CheckResult], None] | None = None,
                  ) -> list[CheckResult]:
        return await check_tasks(self.tasks, self.agent, self.settings.sandbox, self.jobs,
                                 self.settings.verifier, on_result)


class AuditJob:
    """Every chosen attack (default: all) and nop on the tasks of `source`."""

    def __init__(self, settings: RunConfig, source: str, attacks: Sequence[str] | None,
                 jobs: int = 2) -> None:
        self.attacks = chosen_attacks(attacks)  # an unknown attack: one line, before any work
        self.settings, self.jobs = settings, jobs
        self.tasks = list(prepare_run(settings, CHECK, tasks=source).tasks)

    async def run(self, on_result: Callable[[AuditResult], None] | None = None,
                  ) -> list[AuditResult]:
        return await audit_tasks(self.tasks, self.settings.sandbox, self.settings.verifier,
                                 self.jobs, self.attacks, on_result)
