"""Builders for the SWE-bench-format tests: the bundled swe-mini data, its repos on the host, a
Hugging Face datasets cache as a previous online load leaves it, attack variants of a task."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path

from skyrl_agent.tasks import load_task
from skyrl_agent.tasks.spec import TaskSpec
from tests.conftest import REPO

SWE_MINI = REPO / "tasks" / "swe-mini"
INSTANCES = SWE_MINI / "instances.jsonl"


def instance_rows() -> list[dict]:
    return [json.loads(line) for line in INSTANCES.read_text().splitlines()]


def git(repo: Path, *args: str, stdin: str | None = None) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], input=stdin, text=True,
                          capture_output=True, check=True).stdout


def host_repo(repo_name: str, where: Path) -> Path:
    """The full history of a swe-mini repo (future commits included), imported on the host."""
    stream = (SWE_MINI / "repos" / (repo_name.replace("/", "__") + ".fi")).read_text()
    where.mkdir(parents=True)
    git(where, "init", "-q")
    git(where, "fast-import", "--quiet", stdin=stream)
    return where


def future_commits(repo: Path, base: str) -> list[str]:
    """Every commit the stream holds that is not in base's history."""
    return git(repo, "rev-list", "--all", f"^{base}").split()


def history(repo: Path, base: str) -> list[str]:
    """base and its ancestors."""
    return git(repo, "rev-list", base).split()


def hub_cache(home: Path, rows: list[dict], hub_name: str = "princeton-nlp/SWE-bench_Verified",
              split: str = "test") -> None:
    """A datasets cache under HF_HOME=home holding `rows` as `hub_name`, laid out as a load from
    the hub leaves it (namespace___name/config/version/hash); written by datasets' own Parquet
    builder."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets.packaged_modules.parquet.parquet import Parquet

    source = home / "rows.parquet"
    home.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), source)
    owner, name = hub_name.split("/")
    snake = name.lower()
    staging = home / "staging"
    builder = Parquet(cache_dir=str(staging), dataset_name=snake, data_files={split: str(source)})
    builder.download_and_prepare()
    target = home / "datasets" / f"{owner}___{snake}" / "default" / "0.0.0" / "0123456789abcdef"
    target.mkdir(parents=True)
    for made in Path(builder.cache_dir).iterdir():
        shutil.move(made, target / made.name)
    shutil.rmtree(staging)


def attack_task(base: TaskSpec, root: Path, label: str, solve_sh: str) -> TaskSpec:
    """`base` with `solve_sh` as its reference solution: the oracle agent then plays the
    attacker, through the real episode lifecycle."""
    folder = root / label
    shutil.copytree(base.task_dir, folder)
    (folder / "solution" / "solve.sh").write_text(solve_sh)
    task = load_task(folder)
    return dataclasses.replace(task, name=f"attack/{label}", grader=base.grader)
