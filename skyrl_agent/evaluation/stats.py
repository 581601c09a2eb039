"""Offline statistics of stored trajectories: rewards, pass@k, finish reasons, tokens, drift,
where the time went."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from math import comb

from skyrl_agent.tasks.spec import is_impossible_twin
from skyrl_agent.types import Trajectory, mean_time_account

PASS_THRESHOLD = 1.0
"""A sample passes when its reward reaches this (tests all green)."""


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimator of pass@k from n samples with c passes (Chen et al., 2021):
    1 - C(n - c, k) / C(n, k)."""
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 < k <= n and 0 <= c <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


@dataclass(frozen=True)
class TaskRow:
    task_id: str
    samples: int
    passed: int
    reward_mean: float
    masked: int
    turns_mean: float


@dataclass(frozen=True)
class RunSummary:
    trajectories: int
    tasks: int
    reward_mean: float
    """Mean reward over unmasked trajectories."""
    masked: int
    pass_at: dict[int, float]
    """k -> mean of the unbiased pass@k over the tasks with at least k unmasked samples (k up
    to the most any task has)."""
    pass_at_tasks: dict[int, int]
    """k -> how many tasks pass@k is the mean over (the others have fewer unmasked samples)."""
    unscored_tasks: int
    """Tasks whose every sample is masked: no pass@k holds them."""
    finish_reasons: dict[str, int]
    turns_mean: float
    completion_tokens_mean: float
    prompt_tokens_mean: float
    summaries_total: int
    drift_tokens_mean: float
    per_task: list[TaskRow]
    time_account: dict[str, float]
    """Bucket (types.TIME_ACCOUNT) -> mean seconds per trajectory."""
    impossible_twins: int = 0
    """Unmasked samples of impossible twins (tasks.impossible_twins), left out of every other
    number here."""
    impossible_twin_rate: float = 0.0
    """The share of them that earned a reward: each such reward was forged."""


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _ks(n: int) -> list[int]:
    ks = [k for k in (1, 2, 4, 8, 16, 32, 64) if k <= n]
    return ks + ([n] if n and n not in ks else [])


def _scored(row: TaskRow) -> int:
    return row.samples - row.masked


def _pass_at(rows: list[TaskRow], ks: list[int]) -> dict[int, float]:
    """k -> mean pass@k over the rows with at least k unmasked samples (ks none of them has
    are left out)."""
    return {k: _mean([pass_at_k(_scored(r), r.passed, k) for r in rows if _scored(r) >= k])
            for k in ks if any(_scored(r) >= k for r in rows)}


def pass_at_curve(summary: RunSummary) -> dict[int, float]:
    """k -> pass@k for every k from 1 to the most unmasked samples of any task, each over the
    tasks with at least k (empty when no task has any)."""
    most = max((_scored(r) for r in summary.per_task), default=0)
    return _pass_at(summary.per_task, list(range(1, most + 1)))


def summarize(every: list[Trajectory]) -> RunSummary:
    trajectories = [t for t in every if not is_impossible_twin(t.task_id)]
    twins = [t for t in every if is_impossible_twin(t.task_id) and not t.masked]
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        by_task[t.task_id].append(t)
    rows = []
    for task_id, samples in sorted(by_task.items()):
        scored = [t for t in samples if not t.masked]
        rows.append(TaskRow(task_id, len(samples),
                            sum(t.reward.value >= PASS_THRESHOLD for t in scored),
                            _mean([t.reward.value for t in scored]),
                            len(samples) - len(scored), _mean([t.num_turns for t in samples])))
    ks = _ks(max((_scored(r) for r in rows), default=0))
    pass_at = _pass_at(rows, ks)
    unmasked = [t for t in trajectories if not t.masked]

    def metric(name: str) -> list[float]:
        return [float(t.metrics.get(name, 0.0)) for t in trajectories]

    return RunSummary(
        trajectories=len(trajectories), tasks=len(rows),
        reward_mean=_mean([t.reward.value for t in unmasked]),
        masked=len(trajectories) - len(unmasked), pass_at=pass_at,
        pass_at_tasks={k: sum(_scored(r) >= k for r in rows) for k in pass_at},
        unscored_tasks=sum(_scored(r) == 0 for r in rows),
        finish_reasons=dict(Counter(t.finish_reason.value for t in trajectories)),
        turns_mean=_mean([t.num_turns for t in trajectories]),
        completion_tokens_mean=_mean(metric("completion_tokens")),
        prompt_tokens_mean=_mean(metric("prompt_tokens")),
        summaries_total=int(sum(metric("summaries"))),
        drift_tokens_mean=_mean(metric("drift_tokens")), per_task=rows,
        time_account=mean_time_account(trajectories), impossible_twins=len(twins),
        impossible_twin_rate=_mean([float(t.reward.value > 0) for t in twins]))


def describe_time(account: dict[str, float]) -> str:
    """A time account in one line: each bucket's seconds and share of their sum."""
    total = sum(account.values())
    if total <= 0:
        return "no time recorded"
    return " · ".join(f"{bucket} {seconds:.2f}s ({seconds / total:.0%})"
                      for bucket, seconds in account.items())


@dataclass(frozen=True)
class TaskDelta:
    task_id: str
    reward_a: float | None
    reward_b: float | None


def compare(a: RunSummary, b: RunSummary) -> list[TaskDelta]:
    """Per task, the mean reward in each run (None where a run lacks the task)."""
    rewards_a = {r.task_id: r.reward_mean for r in a.per_task}
    rewards_b = {r.task_id: r.reward_mean for r in b.per_task}
    return [TaskDelta(task, rewards_a.get(task), rewards_b.get(task))
            for task in sorted(rewards_a.keys() | rewards_b.keys())]
