"""Generates the bundled `swe-mini` set: SWE-bench-format instances of tiny Python repos made here.

    .venv/bin/python scripts/make_swe_mini.py           write tasks/swe-mini/
    .venv/bin/python scripts/make_swe_mini.py --check   exit 1 unless tasks/swe-mini/ is current

Each repo is a git history with fixed authors and dates (so its commit ids never change): commits
that introduce the code, one commit per fixed bug (source fix plus new tests, as a pull request
lands), and later commits an agent must not see. For each instance the gold patch is the fix
commit's source change and the test patch its test change; FAIL_TO_PASS and PASS_TO_PASS are
measured, not written down: the test patch's files are run with pytest at base_commit and again
with the gold patch, and parsed with swebench's pytest parser. The repos are stored as git
fast-import streams (text) in tasks/swe-mini/repos/.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from swe_mini_repos import REPOS, Commit, Instance, Repo

OUT = Path(__file__).resolve().parents[1] / "tasks" / "swe-mini"
PYTEST = ["-m", "pytest", "-rA", "-p", "no:cacheprovider"]
AUTHOR = ("swe-mini", "swe-mini@example.invalid")


def git(repo: Path, *args: str, when: int = 0, stdin: str | None = None) -> str:
    stamp = f"{1704110400 + when * 86400} +0000"  # 2024-01-01 12:00 UTC + `when` days
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(repo),
           "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": AUTHOR[0],
           "GIT_AUTHOR_EMAIL": AUTHOR[1], "GIT_COMMITTER_NAME": AUTHOR[0],
           "GIT_COMMITTER_EMAIL": AUTHOR[1], "GIT_AUTHOR_DATE": stamp,
           "GIT_COMMITTER_DATE": stamp}
    done = subprocess.run(["git", "-C", str(repo), *args], env=env, input=stdin, text=True,
                          capture_output=True, check=False)
    if done.returncode:
        raise SystemExit(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def build_history(repo: Repo, where: Path) -> list[str]:
    """The repo's commits in order (their ids), with its tags and branches."""
    git(where, "init", "-q", "-b", "main")
    ids = []
    for day, commit in enumerate(repo.commits):
        _apply(where, commit)
        git(where, "add", "-A")
        git(where, "commit", "-q", "-m", commit.message, when=day)
        ids.append(git(where, "rev-parse", "HEAD").strip())
        for tag in commit.tags:
            git(where, "tag", "-a", tag, "-m", f"release {tag}", when=day)
    for branch, at in repo.branches.items():
        git(where, "branch", branch, ids[at])
    return ids


def _apply(where: Path, commit: Commit) -> None:
    for relative, text in commit.files.items():
        path = where / relative
        if text is None:
            path.unlink()
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@dataclass(frozen=True)
class Measured:
    """Test outcomes of one instance."""

    fail_to_pass: list[str]
    pass_to_pass: list[str]


def _statuses(work: Path, test_files: list[str]) -> dict[str, str]:
    from swebench.harness.log_parsers.python import parse_log_pytest
    run = subprocess.run([sys.executable, *PYTEST, *test_files], cwd=work, text=True,
                         capture_output=True, check=False,
                         env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    return parse_log_pytest(run.stdout + run.stderr, None)


def measure(where: Path, base: str, gold: str, tests: str, test_files: list[str]) -> Measured:
    """Run the test patch's files at base and with the gold patch (swebench's verdicts)."""
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch) / "work"
        git(where, "worktree", "add", "-q", "--detach", str(work), base)
        try:
            git(work, "apply", stdin=tests)
            before = _statuses(work, test_files)
            git(work, "apply", stdin=gold)
            after = _statuses(work, test_files)
        finally:
            git(where, "worktree", "remove", "--force", str(work))
    passed = {"PASSED", "XFAIL"}
    broken = sorted(t for t, s in after.items() if s not in passed)
    if broken:
        raise SystemExit(f"the gold patch leaves failing tests: {broken}")
    fail_to_pass = sorted(t for t in after if before.get(t) not in passed)
    pass_to_pass = sorted(t for t in after if before.get(t) in passed)
    if not fail_to_pass:
        raise SystemExit(f"no test fails at {base} (the bug is not real)")
    return Measured(fail_to_pass, pass_to_pass)


def instance_record(repo: Repo, where: Path, ids: list[str], item: Instance) -> dict:
    base, fix = ids[item.base], ids[item.fix]
    gold = git(where, "diff", base, fix, "--", ".", ":(exclude)tests")
    tests = git(where, "diff", base, fix, "--", "tests")
    test_files = sorted(set(re.findall(r"^diff --git a/\S+ b/(\S+)$", tests, re.M)))
    measured = measure(where, base, gold, tests, test_files)
    return {
        "instance_id": f"{repo.name.replace('/', '__')}-{item.number}",
        "repo": repo.name, "base_commit": base, "patch": gold, "test_patch": tests,
        "problem_statement": item.issue, "hints_text": "",
        "created_at": f"2024-01-{item.fix + 1:02d}T12:00:00Z", "version": repo.version,
        "FAIL_TO_PASS": json.dumps(measured.fail_to_pass),
        "PASS_TO_PASS": json.dumps(measured.pass_to_pass),
        "environment_setup_commit": ids[0],
    }


def generate(out: Path) -> None:
    """Write instances.jsonl and repos/*.fi for every repo in swe_mini_repos.py."""
    (out / "repos").mkdir(parents=True, exist_ok=True)
    records = []
    for repo in REPOS:
        with tempfile.TemporaryDirectory() as scratch:
            where = Path(scratch)
            ids = build_history(repo, where)
            records += [instance_record(repo, where, ids, item) for item in repo.instances]
            stream = git(where, "fast-export", "--all", "--signed-tags=strip")
        (out / "repos" / (repo.name.replace("/", "__") + ".fi")).write_text(stream)
    lines = [json.dumps(record) for record in records]
    (out / "instances.jsonl").write_text("\n".join(lines) + "\n")


def _same(kept: Path, made: Path) -> bool:
    return kept.is_file() and kept.read_bytes() == made.read_bytes()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="compare with tasks/swe-mini/ instead of writing it")
    args = parser.parse_args()
    if not args.check:
        generate(OUT)
        print(f"wrote {OUT}")
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        fresh = Path(scratch)
        generate(fresh)
        stale = [str(p.relative_to(fresh)) for p in sorted(fresh.rglob("*")) if p.is_file()
                 and not _same(OUT / p.relative_to(fresh), p)]
    if stale:
        print(f"stale: {', '.join(stale)} (run scripts/make_swe_mini.py)", file=sys.stderr)
        return 1
    print("tasks/swe-mini is current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
