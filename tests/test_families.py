"""Generated task families, fast: determinism per seed, splits, the `gen` source, and the pieces
the checks rest on (git tree ids, reproducible archives, sed escaping, the Python checker)."""

from __future__ import annotations

import io
import subprocess
import tarfile

import pytest

from skyrl_agent.errors import TaskError
from skyrl_agent.tasks import find_task, resolve_tasks
from skyrl_agent.tasks.families import (
    FAMILIES,
    HELDOUT_SEEDS,
    TRAIN_SEEDS,
    family,
    refuse_heldout,
    split_of,
)
from skyrl_agent.tasks.families.archive import tar_gz
from skyrl_agent.tasks.families.git import tree_id
from skyrl_agent.tasks.families.python_bug import CHECKER, POOL, sed_replace
from skyrl_agent.tasks.generated import materialize, parse_ref
from skyrl_agent.tasks.solution import solution_walkthrough, split_commands
from tests.test_cli import assert_one_line_error, run

LEVELS = [(f, d) for f in FAMILIES.values() for d in f.difficulties]


@pytest.mark.parametrize("fam, difficulty", LEVELS, ids=[f"{f.name}@{d}" for f, d in LEVELS])
def test_a_seed_gives_the_same_task_and_other_seeds_other_tasks(fam, difficulty):
    first = fam.generate(7, difficulty)
    assert first.files() == fam.generate(7, difficulty).files()
    seeds = [*range(0, 12), *range(HELDOUT_SEEDS.start, HELDOUT_SEEDS.start + 12)]
    tasks = [fam.generate(seed, difficulty) for seed in seeds]
    assert len({t.digest() for t in tasks}) == len(seeds)
    assert len({t.files()["tests/test.sh"] for t in tasks}) == len(seeds)
    assert {split_of(t.name) for t in tasks[:12]} == {"train"}
    assert {split_of(t.name) for t in tasks[12:]} == {"heldout"}


def test_difficulty_changes_the_task_and_is_bounded():
    fam = family("write-file")
    assert fam.generate(3, 1).digest() != fam.generate(3, 2).digest()
    with pytest.raises(ValueError, match=r"difficulties 1\.\.3"):
        fam.generate(3, 4)
    with pytest.raises(ValueError, match="seeds run from"):
        fam.generate(HELDOUT_SEEDS.stop)


def test_gen_references_select_splits_counts_and_difficulties():
    train = parse_ref("write-file,count@3:train:5")
    assert [(f.name, d) for f, d in train.families] == [("write-file", 1), ("count", 3)]
    assert train.seeds == range(0, 5)
    heldout = parse_ref("all@2:heldout")
    assert len(heldout.families) == len(FAMILIES) and heldout.seeds.start == HELDOUT_SEEDS.start
    assert set(heldout.seeds) <= set(HELDOUT_SEEDS) and len(heldout.seeds) == 20
    assert set(parse_ref(f"all:train:{len(TRAIN_SEEDS)}").seeds) == set(TRAIN_SEEDS)
    for bad, needle in [("write-file", "expected gen:FAMILY"), ("nope:train", "unknown task"),
                        ("count:test", "split must be"), ("count@9:train", "difficulties"),
                        ("count:train:0", "count must be"), ("count@x:train", "number"),
                        (f"count:train:{len(TRAIN_SEEDS) + 1}", "count must be")]:
        with pytest.raises(TaskError, match=needle):
            parse_ref(bad)


def test_gen_source_loads_interleaved_harbor_tasks(tmp_path, monkeypatch):
    monkeypatch.setenv("SKYRL_AGENT_CACHE", str(tmp_path))
    tasks = resolve_tasks("gen:sort-lines,git-commit@2:train:3")
    assert [t.name for t in tasks] == ["gen/sort-lines-d1-0", "gen/git-commit-d2-0",
                                       "gen/sort-lines-d1-1", "gen/git-commit-d2-1",
                                       "gen/sort-lines-d1-2", "gen/git-commit-d2-2"]
    assert tasks[0].config.metadata["split"] == "train" and tasks[0].config.metadata["plan"]
    assert resolve_tasks("gen:count:heldout:4", limit=2)[1].name == "gen/count-d1-10001"
    again = materialize(family("sort-lines").generate(0))
    assert again == tasks[0].task_dir  # written once, found again by its digest
    assert find_task("gen/git-commit-d2-1").task_dir == tasks[3].task_dir  # by name, too
    with pytest.raises(TaskError, match="difficulties"):
        find_task("gen/git-commit-d5-1")


def test_trainers_refuse_held_out_tasks():
    refuse_heldout(["gen/count-d1-9999", "demo/hello-file"], "data")
    with pytest.raises(TaskError, match=r"held-out tasks \(gen/count-d1-10000"):
        refuse_heldout(["gen/count-d1-9999", "gen/count-d1-10000"], "data")


def test_tree_ids_are_the_ones_git_computes(tmp_path):
    files = {"b.txt": b"two\n", "README.md": b"# x\n", "a.txt": b"one\n"}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    git = ["git", "-C", str(tmp_path)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    written = subprocess.run([*git, "write-tree"], check=True, capture_output=True, text=True)
    assert tree_id(files) == written.stdout.strip()


def test_archives_are_reproducible_and_hold_their_members():
    members = {"pkg/README.txt": b"hi\n", "pkg/data/x.txt": b"x\n"}
    assert tar_gz(members) == tar_gz(dict(reversed(members.items())))
    with tarfile.open(fileobj=io.BytesIO(tar_gz(members))) as tar:
        assert sorted(m.name for m in tar.getmembers() if m.isfile()) == sorted(members)
        assert tar.extractfile("pkg/data/x.txt").read() == b"x\n"


@pytest.mark.parametrize("function", POOL, ids=[f.name for f in POOL])
def test_sed_fix_turns_the_buggy_line_into_the_correct_one(tmp_path, function):
    module = tmp_path / "m.py"
    module.write_text(function.source(function.buggy))
    old, new = f"    return {function.buggy}", f"    return {function.correct}"
    subprocess.run(["sed", "-i", sed_replace(old, new), str(module)], check=True)
    assert module.read_text() == function.source(function.correct)


def _check(tmp_path, source: str, cases: list[dict]) -> str:
    checker = tmp_path / "check.py"
    checker.write_text(CHECKER.replace("CASES_JSON", __import__("json").dumps(cases)))
    module = tmp_path / "mod.py"
    module.write_text(source)
    out = subprocess.run(["python3", "-I", "-S", str(checker), str(module)], capture_output=True,
                         text=True, timeout=30, cwd=tmp_path)
    return out.stdout.strip().splitlines()[-1]


CLAMP = next(f for f in POOL if f.name == "clamp")
CASES = [{"function": "clamp", "args": [15, 0, 10], "want": 10},
         {"function": "clamp", "args": [-3, 0, 10], "want": 0}]


@pytest.mark.parametrize("extra", [
    "import os\n", "x = open('/tmp/planted', 'w')\n", "y = ().__class__\n",
    "def __init__():\n    return 1\n", "z = [c for c in __builtins__]\n",
    "w = (lambda: 1)()\n", "@max\ndef f(a):\n    return a\n"])
def test_the_checker_runs_only_plain_functions(tmp_path, extra):
    """Correct code plus one thing beyond the allowed syntax scores as failed: nothing of the
    module ever runs outside the whitelist (the correct functions alone pass)."""
    correct = CLAMP.source(CLAMP.correct)
    assert _check(tmp_path, correct, CASES) == "ALL CHECKS PASSED"
    assert _check(tmp_path, CLAMP.source(CLAMP.buggy), CASES) == "CHECKS FAILED"
    assert _check(tmp_path, correct + extra, CASES) == "CHECKS FAILED"
    assert not (tmp_path / "planted").exists()


def test_a_linked_module_is_refused(tmp_path):
    real = tmp_path / "real.py"
    real.write_text(CLAMP.source(CLAMP.correct))
    checker = tmp_path / "check.py"
    checker.write_text(CHECKER.replace("CASES_JSON", __import__("json").dumps(CASES)))
    (tmp_path / "mod.py").symlink_to(real)
    out = subprocess.run(["python3", "-I", "-S", str(checker), str(tmp_path / "mod.py")],
                         capture_output=True, text=True, timeout=30)
    assert out.stdout.strip().splitlines()[-1] == "CHECKS FAILED"


def test_solve_scripts_split_into_typed_commands():
    script = ("#!/bin/bash\nset -euo pipefail\n# why\n\ncd /app\ncat > a <<'EOF'\nx\n\nEOF\n"
              "echo a \\\n  b\necho c\n")
    assert split_commands(script) == ["cd /app", "cat > a <<'EOF'\nx\n\nEOF", "echo a \\\n  b",
                                      "echo c"]


def test_tasks_generate_writes_loadable_tasks_and_refuses_bad_input(tmp_path):
    out = tmp_path / "tasks"
    result = run("tasks", "generate", "count", "--seeds", "9999:10001", "--difficulty", "2",
                 "--output", str(out))
    assert result.returncode == 0, result.stderr
    assert "split heldout and train" in result.stdout
    loaded = resolve_tasks(str(out))
    assert [t.name for t in loaded] == ["gen/count-d2-10000", "gen/count-d2-9999"]
    assert (out / "count-d2-9999" / "tests" / "test.sh").read_bytes() == \
        family("count").generate(9999, 2).files()["tests/test.sh"]
    assert_one_line_error(run("tasks", "generate", "count", "--seeds", "1:2", "--output",
                              str(out), "--difficulty", "4"), "difficulties 1..3")
    assert_one_line_error(run("tasks", "generate", "count", "--seeds", "5", "--output",
                              str(out)), "--seeds")
    assert_one_line_error(run("tasks", "generate", "count", "--seeds", "9999:10000",
                              "--difficulty", "2", "--output", str(out)), "exists")


def test_a_walkthrough_survives_task_toml_and_a_malformed_one_is_a_task_error(tmp_path,
                                                                            monkeypatch):
    """Stops: a walkthrough lost or reordered on its way through task.toml (demonstrations of
    long-horizon tasks would fall back to one turn), or a malformed one read as steps."""
    monkeypatch.setenv("SKYRL_AGENT_CACHE", str(tmp_path))
    generated = family("follow-clues").generate(5, 2)
    [task] = resolve_tasks("gen:follow-clues@2:train:6")[5:]
    assert solution_walkthrough(task) == list(generated.blueprint.steps)
    assert all(step.carry for step in generated.blueprint.steps)
    assert solution_walkthrough(resolve_tasks("gen:count:train:1")[0]) == []
    for bad in ([{"commands": []}], [{"commands": ["ls"], "finding": 3}], ["ls"],
                [{"commands": ["ls"], "finding": "x", "carry": ["y"]}]):
        task.config.metadata["walkthrough"] = bad
        with pytest.raises(TaskError, match="walkthrough must be"):
            solution_walkthrough(task)
