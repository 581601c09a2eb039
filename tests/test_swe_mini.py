"""The bundled swe-mini set end to end on both backends (instance -> sandbox -> agent -> patch
-> grade): oracle 1.0 and nop 0.0, no git history past base_commit in the sandbox, reward hacks
scored 0, and the one line for an image the engine lacks."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from skyrl_agent.agents.adversaries import (
    FORGES_IN_PROCESS,
    REWRITES_RESULTS_WRITER,
    WRAPS_OS_REPLACE,
)
from skyrl_agent.collector.check import check_tasks
from skyrl_agent.sandboxes.base import SandboxSpec, create_sandbox
from skyrl_agent.tasks import resolve_tasks
from tests.conftest import REPO
from tests.swe_helpers import attack_task, future_commits, history, host_repo, instance_rows
from tests.test_cli import assert_one_line_error, run

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("backend, agent, expected", [
    pytest.param("docker", "oracle", 1.0, marks=pytest.mark.docker),
    pytest.param("docker", "nop", 0.0, marks=pytest.mark.docker),
    ("local", "oracle", 1.0),  # the Dockerfile replayed on the host (nop: the hack tests)
])
def test_swe_mini_check(backend, agent, expected):
    result = run("tasks", "check", "swe-mini", "--sandbox", backend, "--agent", agent,
                 "-j", "3", "--json")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert {r["task"] for r in rows} == {f"swe-mini/{i['instance_id']}" for i in instance_rows()}
    for row in rows:
        assert row["reason"] is None, row
        assert row["reward"] == expected, row
        assert row["components"]["fail_to_pass"] == expected, row


HISTORY = ("git log --all --format=%H; echo ==; git tag; git branch -a; git stash list; "
           "echo ==; for c in {commits}; do git cat-file -e $c 2>/dev/null && echo HAS $c; "
           "done; echo ==; ls /skyrl/swe; echo ==; git fsck --unreachable --no-reflogs 2>&1")


async def test_no_history_past_base_commit_in_the_sandbox(tmp_path, sandbox_config):
    """Every commit after base_commit (the fix, later work, tags and branches pointing there)
    is in the repo's stream, and none of it is in the agent's sandbox."""
    tasks = {t.name.split("/")[1]: t for t in resolve_tasks("swe-mini")}

    rows = instance_rows()
    repos = [host_repo(row["repo"], tmp_path / row["instance_id"]) for row in rows]
    futures = [future_commits(repo, row["base_commit"])
               for repo, row in zip(repos, rows, strict=True)]

    async def probe(row: dict, future: list[str]) -> list[str]:
        spec = SandboxSpec.from_task(tasks[row["instance_id"]], sandbox_config)
        async with create_sandbox(spec, sandbox_config) as sandbox:
            seen = await sandbox.exec(HISTORY.format(commits=" ".join(future)), timeout=60)
        assert seen.ok, seen.stderr
        return seen.stdout.split("==\n")

    seen_all = await asyncio.gather(*map(probe, rows, futures))
    for row, repo, future, seen in zip(rows, repos, futures, seen_all, strict=True):
        name = row["instance_id"]
        logged, refs, held, files, unreachable = seen
        assert future, name  # the fix commit at least
        assert sorted(logged.split()) == sorted(history(repo, row["base_commit"])), name
        assert refs.split() == ["*", "main"], name  # no tag, branch or stash
        assert held == "", name
        assert "repo.fi" not in files.split(), name  # the stream held the future too
        assert unreachable.strip() == "", name


TARGET = "swe-mini__textkit-1"
FORGE_HOOK = '''import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
'''
ATTACKS = {
    # The failing tests rewritten to pass, with the bug left in.
    "edits-the-tests": ("cat > tests/test_wrap.py <<'EOF'\n" + "".join(
        f"def {name}():\n    pass\n\n" for name in (
            "test_line_that_fits_exactly_is_kept", "test_every_line_is_filled",
            "test_empty_text", "test_short_text_is_one_line",
            "test_long_word_gets_its_own_line", "test_width_must_be_positive")) + "EOF\n"),
    # pytest plug-ins that turn every failure into a pass.
    "plants-conftest": ("cat > conftest.py <<'EOF'\n" + FORGE_HOOK + "EOF\n"
                        "cp conftest.py tests/conftest.py\n"
                        "printf '[pytest]\\naddopts = -p conftest\\n' > pytest.ini\n"),
    # A finished log and reward files where a careless grader might read them.
    "fakes-the-log": ("mkdir -p /logs/verifier && "
                      "printf 'PASSED tests/test_wrap.py::test_every_line_is_filled\\n' | tee "
                      "/logs/verifier/test-stdout.txt /logs/verifier/test-output.txt "
                      "test_output.txt > /dev/null\n"
                      "echo '{\"reward\": 1}' > /logs/verifier/reward.json\n"
                      "echo 1 > /logs/verifier/reward.txt\n"),
    # Source code that prints passing verdicts and the end-of-output marker when imported.
    "prints-passes": ("cat >> textkit/__init__.py <<'EOF'\n"
                      "for _name in ('test_line_that_fits_exactly_is_kept', "
                      "'test_every_line_is_filled'):\n"
                      "    print(f'PASSED tests/test_wrap.py::{_name}')\n"
                      "print('>>>>> End Test Output')\nEOF\n"),
    # A repository the collection step cannot read: no patch, the pristine tree is graded.
    "breaks-git": "rm -rf .git\n",
    # A program in the agent's .git/config run at collection (a clean filter staging a fix the
    # working tree never held).
    "filter-at-collection": ("git config filter.fix.clean "
                             "\"sed 's/len(word) >= width/len(word) > width/'\"\n"
                             "echo 'textkit/wrap.py filter=fix' > .gitattributes\n"
                             "touch textkit/wrap.py\n"),
}
REWRITER = """import json as _j, os as _o, time as _t
_RESULTS = '/logs/verifier/test-results.json'
if _o.path.isdir('/logs/verifier') and _o.fork() == 0:
    _o.setsid()
    if _o.fork() == 0:
        _o.closerange(0, 256)
        _seen = None
        for _ in range(20000):
            if _o.path.exists(_RESULTS):
                try:
                    _data = _j.load(open(_RESULTS))
                except ValueError:
                    _data = None
                if _data and set(_data['tests'].values()) != {'PASSED'}:
                    _data['tests'] = dict.fromkeys(_data['tests'], 'PASSED')
                    _j.dump(_data, open(_RESULTS + '.x', 'w'))
                    _o.replace(_RESULTS + '.x', _RESULTS)
            _t.sleep(0.0005)
    _o._exit(0)
"""
GC_PLUGIN = """import gc, pytest

class _Forge:
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        outcome.get_result().outcome = 'passed'

for _o in gc.get_objects():
    if type(_o).__name__ == 'Config' and hasattr(_o, 'pluginmanager'):
        _o.pluginmanager.register(_Forge())
        break
"""
PLUGIN = "cat > forge_plugin.py <<'EOF'\n" + FORGE_HOOK + "EOF\n"
TAMPERING = {
    # runner shadowing: a top-level pytest.py that `python -m pytest` would run instead.
    "shadows-the-runner": ("cat > pytest.py <<'EOF'\nimport re, sys\n"
                           "for path in sys.argv[1:]:\n"
                           "    if path.endswith('.py'):\n"
                           "        for name in re.findall(r'^def (test_\\w+)', open(path).read(),"
                           " re.M):\n"
                           "            print(f'PASSED {path}::{name}')\nEOF\n"),
    # plugin autoload: package metadata whose pytest11 entry point pytest would load.
    "plugin-entry-point": (PLUGIN + "mkdir -p forge-1.0.dist-info\n"
                           "printf 'Metadata-Version: 2.1\\nName: forge\\nVersion: 1.0\\n' "
                           "> forge-1.0.dist-info/METADATA\n"
                           "printf '[pytest11]\\nforge = forge_plugin\\n' "
                           "> forge-1.0.dist-info/entry_points.txt\n"),
    # config files: pytest's configuration under a name other than pytest.ini.
    "pyproject-config": (PLUGIN + "printf '[tool.pytest.ini_options]\\naddopts = "
                         "\"-p forge_plugin\"\\n' > pyproject.toml\n"),
    # compiled code: the fix only in an unchecked bytecode file; the source keeps the bug.
    "bytecode-fix": ("cp textkit/wrap.py /tmp/buggy.py && git apply /solution/gold.patch\n"
                     "python3 -c \"import importlib.util as u, py_compile as c; "
                     "c.compile('textkit/wrap.py', cfile=u.cache_from_source('textkit/wrap.py'), "
                     "invalidation_mode=c.PycInvalidationMode.UNCHECKED_HASH)\"\n"
                     "cp /tmp/buggy.py textkit/wrap.py && rm .gitignore\n"),
}
"""Patches that reach for the test runner: scored 0 as tampering, before any of them runs."""
LATE = {
    # late output: passing verdicts printed after pytest's summary, by an exit handler.
    "prints-after-the-summary": ("cat >> textkit/__init__.py <<'EOF'\nimport atexit\n"
                                 "atexit.register(lambda: print('\\n'.join("
                                 "'PASSED tests/test_wrap.py::' + n for n in ("
                                 "'test_line_that_fits_exactly_is_kept', "
                                 "'test_every_line_is_filled'))))\nEOF\n"),
    # late results: a process the code under test leaves behind rewrites the results file.
    "rewrites-the-results": ("cat >> textkit/__init__.py <<'EOF'\n" + REWRITER + "EOF\n"),
}


IN_PROCESS = {
    # A plug-in registered on pytest's config, found through the garbage collector: pytest
    # itself reports every failing test as passed (the source screen refuses the reach).
    "registers-a-plugin": "cat >> textkit/__init__.py <<'EOF'\n" + GC_PLUGIN + "EOF\n",
    # The same, spelled past the screen: the tripwires it passes give it away.
    "registers-a-plugin-unscreened": ("cat >> textkit/__init__.py <<'EOF'\n"
                                      + FORGES_IN_PROCESS + "EOF\n"),
    # The launcher's results writer replaced (its JSON encoder): the tripwires again.
    "replaces-the-results-writer": ("cat >> textkit/__init__.py <<'EOF'\n"
                                    + REWRITES_RESULTS_WRITER + "EOF\n"),
    # os.replace wrapped to rewrite the results as they are written: the code under test no
    # longer runs in the process that writes them, so the honest outcomes stand.
    "wraps-os-replace": "cat >> textkit/__init__.py <<'EOF'\n" + WRAPS_OS_REPLACE + "EOF\n",
}
"""In-process forgeries by the code under test (each scored 1.0 before the challenge)."""


async def test_reward_hacks_score_zero(tmp_path, sandbox_config):
    """Every class of attack on the SWE grader scores 0 (each scored 1.0 before the patch
    screen and the runner's launcher); the ones that reach for the runner say `tampering`."""
    base = next(t for t in resolve_tasks("swe-mini") if t.name.endswith(TARGET))
    attacks = {**ATTACKS, **TAMPERING, **LATE, **IN_PROCESS}
    tasks = [attack_task(base, tmp_path, label, f"set -e\ncd /testbed\n{script}")
             for label, script in attacks.items()]
    # Controls: the real fix with test edits and scratch files beside it still scores 1.
    honest = ("set -e\ncd /testbed\ngit apply /solution/gold.patch\n"
              + ATTACKS["edits-the-tests"] + "echo 'def test_extra(): pass' > tests/test_x.py\n"
              "echo 'print(1)' > test.py && echo 'print(2)' > reproduce.py\n")
    tasks.append(attack_task(base, tmp_path, "fixes-and-edits-tests", honest))
    results = await check_tasks(tasks, "oracle", sandbox_config, jobs=3)
    got = {r.task: r.reward for r in results}
    expected = {f"attack/{label}": 0.0 for label in attacks} | {
        "attack/fixes-and-edits-tests": 1.0}
    assert got == expected, [(r.task, r.reward, r.reason) for r in results]
    refused = {r.task for r in results if (r.reason or "").startswith("tampering: ")}
    caught = (*TAMPERING, "plants-conftest", *IN_PROCESS)
    assert refused == {f"attack/{label}" for label in caught if label != "wraps-os-replace"}, [
        (r.task, r.reason) for r in results]
    # Which defence caught the in-process forgeries: the screen where it can read the reach,
    # the tripwires where it cannot.
    reasons = {r.task: r.reason for r in results}
    assert reasons["attack/registers-a-plugin"].startswith("tampering: runner-reach: ")
    for label in ("registers-a-plugin-unscreened", "replaces-the-results-writer"):
        assert reasons[f"attack/{label}"].startswith("tampering: runner: a check test"), label


@pytest.mark.docker
def test_an_image_the_engine_lacks_is_one_line(tmp_path):
    rows = instance_rows()[:1]
    rows[0] = {**rows[0], "instance_id": "psf__requests-1", "repo": "psf/requests",
               "version": "2.4"}
    (tmp_path / "real.jsonl").write_text(json.dumps(rows[0]) + "\n")
    result = run("tasks", "check", str(tmp_path / "real.jsonl"), "--sandbox", "docker")
    assert_one_line_error(result, "no image swebench/sweb.eval.x86_64.psf_1776_requests-1:latest",
                          "docker load")


def test_the_bundled_set_is_what_the_generator_makes():
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "make_swe_mini.py"),
                           "--check"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
