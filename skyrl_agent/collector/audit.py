"""`tasks audit`: run the built-in adversaries against tasks and report which can be gamed.

Each task runs once with `nop` (the reward of doing nothing) and once per attack in
agents/adversaries.py, through the same episode as any run (separate-mode verification unless
the task says otherwise). A task is gameable when an attack scores more than nop: the attacks
never do the task, so any reward they earn was forged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from skyrl_agent.agents.adversaries import ATTACKS, Adversary
from skyrl_agent.collector.check import CheckResult, check_task
from skyrl_agent.config import SandboxConfig, VerifierConfig
from skyrl_agent.errors import UserError
from skyrl_agent.sandboxes.pool import SandboxPool
from skyrl_agent.tasks.spec import TaskSpec

TOLERANCE = 1e-9


@dataclass(frozen=True)
class AuditResult:
    """One task under nop and every attack."""

    task: str
    baseline: CheckResult
    """What doing nothing scores."""
    attacks: dict[str, CheckResult] = field(default_factory=dict)
    """Attack name -> its episode's result."""

    @property
    def gameable_by(self) -> list[str]:
        """The attacks that scored more than doing nothing."""
        return [name for name, result in self.attacks.items()
                if result.reward > self.baseline.reward + TOLERANCE]

    def to_json(self) -> dict:
        return {"task": self.task, "baseline": self.baseline.reward,
                "attacks": {name: r.reward for name, r in self.attacks.items()},
                "gameable_by": self.gameable_by}


def chosen_attacks(names: Sequence[str] | None) -> list[str]:
    """The attacks to run (all by default); an unknown name is one line."""
    if not names:
        return list(ATTACKS)
    unknown = [n for n in names if n not in ATTACKS]
    if unknown:
        raise UserError(f"unknown attack {unknown[0]!r} (known: {', '.join(ATTACKS)})")
    return list(names)


async def audit_tasks(tasks: list[TaskSpec], config: SandboxConfig,
                      verifier: VerifierConfig | None = None, jobs: int = 1,
                      attacks: Sequence[str] | None = None,
                      on_result: Callable[[AuditResult], None] | None = None,
                      ) -> list[AuditResult]:
    """Audit every task, at most `jobs` episodes at once; results in the tasks' order."""
    names = chosen_attacks(attacks)
    pool = SandboxPool(config, size=config.warm_pool, stop_in_background=True)
    limit = asyncio.Semaphore(jobs)

    async def episode(task: TaskSpec, attack: str | None) -> CheckResult:
        async with limit:
            return await check_task(task, Adversary(attack) if attack else "nop", pool,
                                    verifier)

    async def one(task: TaskSpec) -> AuditResult:
        baseline, *results = await asyncio.gather(
            episode(task, None), *[episode(task, name) for name in names])
        result = AuditResult(task.name, baseline, dict(zip(names, results, strict=True)))
        if on_result is not None:
            on_result(result)
        return result

    try:
        return list(await asyncio.gather(*(one(t) for t in tasks)))
    finally:
        await asyncio.shield(pool.close())
