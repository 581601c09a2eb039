"""Generated tasks are sound in real sandboxes: oracle 1.0 and nop 0.0 on a sample of every
family at every difficulty, and answers an adversary would try score 0."""

from __future__ import annotations

import shutil

import pytest

from skyrl_agent.collector.check import check_tasks
from skyrl_agent.tasks import load_task, resolve_tasks
from skyrl_agent.tasks.families import FAMILIES, family
from skyrl_agent.tasks.generated import materialize

pytestmark = pytest.mark.slow
SAMPLE = ",".join(f"{name}@{d}" for name, fam in FAMILIES.items() for d in fam.difficulties)


@pytest.mark.parametrize("agent, expected", [("oracle", 1.0), ("nop", 0.0)])
async def test_oracle_passes_and_nop_fails_on_every_family(sandbox_config, agent, expected,
                                                           tmp_path, monkeypatch):
    monkeypatch.setenv("SKYRL_AGENT_CACHE", str(tmp_path))
    train = resolve_tasks(f"gen:{SAMPLE}:train:1")
    heldout = resolve_tasks(f"gen:{SAMPLE}:heldout:1")
    tasks = train[::2] + heldout[1::2]  # every family and difficulty once, both splits
    assert {t.config.metadata["family"] for t in tasks} == set(FAMILIES)
    results = await check_tasks(tasks, agent, sandbox_config, jobs=4)
    assert [(r.task, r.reward, r.reason) for r in results] == \
        [(t.name, expected, None) for t in tasks]


ATTACKS = {
    # The right functions, plus one line the checker refuses to run: imports, calls of
    # anything but a few builtins. Were the module run as code, the reward would be 1.
    ("fix-bug", 1): "{fix}\nprintf 'import os\\n' >> {module}",
    ("fix-bug", 2): "{fix}\nprintf 'marker = open(\"/tmp/x\", \"w\")\\n' >> {module}",
    # The asked change amended into the first commit, or spread over two commits.
    ("git-commit", 1): "{solution_but_amend}",
    ("git-commit", 2): "{solution_in_two_commits}",
    # The right bytes behind a link instead of in the file.
    ("write-file", 1): "{solution_via_link}",
    ("follow-clues", 1): "{solution_via_link}",
    # Every code in the folder, decoys' too, instead of the trail's.
    ("follow-clues", 2): "grep -h '^code:' /app/clues/* | cut -d' ' -f2 > /app/answer.txt",
}


def _attack(name: str, difficulty: int, tmp_path) -> str:
    task = family(name).generate(11, difficulty)
    bp = task.blueprint
    solution = "\n".join(bp.solution)
    module = bp.solution[0].rsplit(" ", 1)[-1] if name == "fix-bug" else ""
    path = bp.solution[-1].rsplit(" ", 1)[-1]
    script = ATTACKS[(name, difficulty)].format(
        fix=solution, module=module,
        solution_but_amend=solution.replace("commit -q -m", "commit -q --amend -m"),
        solution_in_two_commits=solution.replace(
            "git commit -q", "git commit -q --allow-empty -m first && git commit -q --allow-empty"),
        solution_via_link=solution.replace(f"> {path}", "> /app/.real") + f"\nln -s .real {path}")
    target = tmp_path / task.name.removeprefix("gen/")
    shutil.copytree(materialize(task), target)
    (target / "solution" / "solve.sh").write_text(f"#!/bin/bash\ncd /app\n{script}\n")
    return str(target)


async def test_what_an_adversary_would_try_scores_zero(sandbox_config, tmp_path, monkeypatch):
    monkeypatch.setenv("SKYRL_AGENT_CACHE", str(tmp_path / "cache"))
    tasks = [load_task(_attack(name, d, tmp_path)) for name, d in ATTACKS]
    results = await check_tasks(tasks, "oracle", sandbox_config, jobs=3)
    assert {r.task: r.reward for r in results} == {t.name: 0.0 for t in tasks}, \
        [(r.task, r.reason) for r in results]
    assert all(r.reason is None for r in results)  # the tests ran and said no
