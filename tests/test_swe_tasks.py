"""SWE-bench-format instances as tasks: reading instance files and the local HF cache, the
materialized Harbor task folders, routing of `--tasks`, swebench's grading of real pytest
output, and the one-line errors when a dataset is missing."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from skyrl_agent.errors import TaskError
from skyrl_agent.sandboxes.docker_images import from_images
from skyrl_agent.sandboxes.dockerfile import parse_dockerfile
from skyrl_agent.tasks import find_task, resolve_tasks
from skyrl_agent.tasks.swe.harness import SweGrader, image_name
from skyrl_agent.tasks.swe.instance import SweInstance, read_instances
from skyrl_agent.tasks.swe.materialize import LOCAL_BASE_IMAGE, MODEL_PATCH, Origin, materialize
from tests.swe_helpers import INSTANCES, git, host_repo, hub_cache, instance_rows
from tests.test_cli import assert_one_line_error, run

RUN_PYTEST = Path(__file__).parents[1] / "skyrl_agent" / "tasks" / "swe" / "run_pytest.py"


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """Task folders go to a cache of the test's own (CLI tests keep the shared one: its
    converted model)."""
    monkeypatch.setenv("SKYRL_AGENT_CACHE", str(tmp_path / "cache"))


def test_instance_files_in_every_format(tmp_path):
    rows = instance_rows()
    expected = read_instances(INSTANCES)
    assert [i.instance_id for i in expected] == [r["instance_id"] for r in rows]
    assert expected[0].fail_to_pass == tuple(json.loads(rows[0]["FAIL_TO_PASS"]))
    (tmp_path / "list.json").write_text(json.dumps(rows))
    import pyarrow as pa
    import pyarrow.parquet as pq
    as_lists = [{**r, "FAIL_TO_PASS": json.loads(r["FAIL_TO_PASS"]),
                 "PASS_TO_PASS": json.loads(r["PASS_TO_PASS"])} for r in rows]
    pq.write_table(pa.Table.from_pylist(as_lists), tmp_path / "rows.parquet")
    assert read_instances(tmp_path / "list.json") == expected
    assert read_instances(tmp_path / "rows.parquet") == expected


@pytest.mark.parametrize("edit, message", [
    (lambda rows: [json.dumps(rows[0]), "{not json"], r"x.jsonl:2: not JSON"),
    (lambda rows: [json.dumps({k: v for k, v in rows[0].items() if k != "patch"})],
     r"x.jsonl:1 \(swe-mini__textkit-1\): patch: Field required"),
    (lambda rows: [json.dumps({**rows[0], "FAIL_TO_PASS": "tests::a"})],
     r"FAIL_TO_PASS: not a JSON list"),
    (lambda rows: [json.dumps(rows[0])] * 2, r"swe-mini__textkit-1 appears twice"),
    (lambda rows: ["", "  "], r"holds no instances"),
    (lambda rows: ["[1, 2]"], r"x.jsonl:1: not a JSON object"),
])
def test_defective_instance_files_are_one_clear_error(tmp_path, edit, message):
    path = tmp_path / "x.jsonl"
    path.write_text("\n".join(edit(instance_rows())) + "\n")
    with pytest.raises(TaskError, match=message):
        read_instances(path)


def test_swe_mini_tasks_are_harbor_tasks_graded_by_swebench(private_cache):
    tasks = resolve_tasks("swe-mini")
    rows = {r["instance_id"]: r for r in instance_rows()}
    assert len(tasks) == len(rows) >= 6
    for task in tasks:
        row = rows[task.name.removeprefix("swe-mini/")]
        assert row["problem_statement"].strip() in task.instruction
        assert isinstance(task.grader, SweGrader)
        config = task.config
        assert [a if isinstance(a, str) else a.source for a in config.artifacts] == [MODEL_PATCH]
        assert config.verifier.environment_mode == "separate"
        assert config.environment.workdir == "/testbed" and not task.network_allowed
        dockerfile = task.dockerfile.read_text()
        assert dockerfile.startswith(f"FROM {LOCAL_BASE_IMAGE}\n")
        assert f"--import /skyrl/swe/repo.fi {row['base_commit']}" in dockerfile
        assert (task.solution_dir / "gold.patch").read_text() == row["patch"]
        # The test patch reaches the sandbox only with tests/, at verification.
        assert row["test_patch"] in (task.tests_dir / "test.sh").read_text()
        for other in (task.environment_dir, task.solution_dir):
            for path in other.rglob("*"):
                assert not path.is_file() or row["test_patch"] not in path.read_text()
        assert row["test_patch"] not in task.instruction
    again = resolve_tasks("swe-mini")
    assert [t.task_dir for t in again] == [t.task_dir for t in tasks]  # written once


def test_a_changed_instance_gets_a_new_folder(private_cache):
    instance = read_instances(INSTANCES)[0]
    first = materialize(instance, "x/one", Origin(None))
    changed = instance.model_copy(update={"problem_statement": "Something else."})
    second = materialize(changed, "x/one", Origin(None))
    assert first.task_dir != second.task_dir
    assert "Something else." in second.instruction


def test_references_route_to_the_swe_source(tmp_path, private_cache):
    copy = tmp_path / "picked.jsonl"
    shutil.copyfile(INSTANCES, copy)  # no repos/ beside it: the bundled repos are found
    by_path = resolve_tasks(str(copy), limit=2)
    assert [t.name for t in by_path] == ["picked/swe-mini__textkit-1",
                                         "picked/swe-mini__textkit-2"]
    assert by_path[0].dockerfile.read_text().startswith(f"FROM {LOCAL_BASE_IMAGE}")
    assert [t.name for t in resolve_tasks(f"swe:{copy}", limit=2)] == [t.name for t in by_path]
    assert resolve_tasks(str(INSTANCES.parent))[0].name == "swe-mini/swe-mini__textkit-1"
    assert find_task("swe-mini/swe-mini__durations-2").grader is not None
    with pytest.raises(TaskError, match="no task named"):
        find_task("demo/not-a-task")
    with pytest.raises(TaskError, match="neither a file of instances"):
        resolve_tasks("swe:nowhere.csv")


def _instance(**changes) -> SweInstance:
    return read_instances(INSTANCES)[0].model_copy(update=changes)


def test_swebench_repos_run_on_their_instance_image_with_swebench_commands(private_cache):
    test_patch = ("diff --git a/tests/auth_tests/test_validators.py "
                  "b/tests/auth_tests/test_validators.py\n--- a/tests/auth_tests/test_validators.py"
                  "\n+++ b/tests/auth_tests/test_validators.py\n@@ -1 +1,2 @@\n a\n+b\n")
    django = _instance(instance_id="django__django-11099", repo="django/django", version="3.0",
                       test_patch=test_patch)
    task = materialize(django, "swe-bench/django__django-11099", Origin(None))
    assert task.dockerfile.read_text().startswith(
        "FROM swebench/sweb.eval.x86_64.django_1776_django-11099:latest\n")
    test_sh = (task.tests_dir / "test.sh").read_text()
    assert ("./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 "
            "auth_tests.test_validators") in test_sh
    assert "conda activate testbed" in test_sh
    assert "--exclude=tests/auth_tests/test_validators.py" in test_sh
    # The install command runs on the pristine tree, before the agent's patch: the agent's
    # setup.py never runs (it could read the verification's challenge first).
    install = "( source /opt/miniconda3/bin/activate && conda activate testbed && "
    assert test_sh.count("python -m pip install -e .") == 1
    assert test_sh.index(install) < test_sh.index('git apply -v --binary')
    assert image_name(_instance(instance_id="getmoto__moto-7365"), "xingyaoww") == (
        "xingyaoww/sweb.eval.x86_64.getmoto_s_moto-7365:latest")


def test_a_repo_swebench_does_not_know_is_run_with_pytest_and_said_so(caplog, private_cache):
    unknown = _instance(instance_id="acme__widgets-1", repo="acme/widgets", version="9.9")
    with caplog.at_level(logging.WARNING):
        task = materialize(unknown, "x/acme__widgets-1", Origin(None))
        materialize(unknown, "x/acme__widgets-1", Origin(None))
    warnings = [r for r in caplog.records if "acme/widgets" in r.getMessage()]
    assert len(warnings) == 1 and "pytest" in warnings[0].getMessage()
    test_sh = (task.tests_dir / "test.sh").read_text()
    assert ("python3 -s /tests/run_pytest.py --end-others --challenge /tests/challenge.json "
            "/logs/verifier/test-results.json -rA") in test_sh
    assert "python3 -m pytest" not in test_sh
    assert isinstance(task.grader, SweGrader) and task.grader.structured


def _pytest_output(work, files) -> str:
    done = subprocess.run([sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider",
                           *files], cwd=work, capture_output=True, text=True, check=False)
    return done.stdout + done.stderr


def test_the_grader_reads_real_pytest_output(tmp_path):
    from swebench.harness.constants import END_TEST_OUTPUT
    instance = read_instances(INSTANCES)[0]
    grader = SweGrader(instance, local_repo=True)
    work = host_repo(instance.repo, tmp_path / "repo")
    git(work, "checkout", "-q", instance.base_commit)
    git(work, "apply", stdin=instance.test_patch)
    files = ["tests/test_wrap.py"]
    unfixed = _pytest_output(work, files)
    graded = grader.grade("script log", unfixed)
    assert graded.value == 0.0 and graded.reason is None
    assert graded.components["fail_to_pass"] == 0.0
    assert graded.components["pass_to_pass"] == 1.0
    # Lines the code under test prints cannot cut the graded region short.
    forged = "".join(f"PASSED {t}\n" for t in (*instance.fail_to_pass, *instance.pass_to_pass))
    assert grader.grade("", f"{forged}{END_TEST_OUTPUT}\n{unfixed}").value == 0.0
    git(work, "apply", stdin=instance.patch)
    fixed = grader.grade("script log", _pytest_output(work, files))
    assert fixed.value == 1.0 and dict(fixed.components) == {
        "reward": 1.0, "fail_to_pass": 1.0, "pass_to_pass": 1.0}
    assert grader.grade(">>>>> Patch Apply Failed\n", None).reason == (
        "the agent's patch did not apply")
    assert "did not run" in (grader.grade("", None).reason or "")
    crashed = grader.grade("", "E   ModuleNotFoundError: No module named 'pytest'\n")
    assert crashed.reason == ("no test results in the test output: "
                              "E   ModuleNotFoundError: No module named 'pytest'")


def _launched(work, files, results) -> dict:
    """The verifier's launcher run on the host: its results file, read back."""
    subprocess.run([sys.executable, "-s", str(RUN_PYTEST), str(results), "-rA",
                    "-p", "no:cacheprovider", *files], cwd=work, capture_output=True, check=False)
    return json.loads(results.read_text())


def test_the_launcher_grades_from_results_not_output(tmp_path):
    """Late output: an exit handler in the code under test printing passing verdicts after
    pytest's summary is never graded; a runner module in the repo is never imported."""
    instance = read_instances(INSTANCES)[0]
    grader = SweGrader(instance, local_repo=True, structured=True)
    assert grader.test_output == "/logs/verifier/test-results.json"
    work = host_repo(instance.repo, tmp_path / "repo")
    git(work, "checkout", "-q", instance.base_commit)
    git(work, "apply", stdin=instance.test_patch)
    late = "".join(f"PASSED {t}\n" for t in instance.fail_to_pass)
    (work / "textkit" / "__init__.py").write_text(
        f"import atexit\natexit.register(lambda: print({late!r}))\n")
    (work / "pytest.py").write_text("raise SystemExit('the repo shadowed the runner')\n")
    unfixed = _launched(work, ["tests/test_wrap.py"], tmp_path / "unfixed.json")
    assert set(unfixed["tests"]) == {*instance.fail_to_pass, *instance.pass_to_pass}
    graded = grader.grade("", json.dumps(unfixed))
    assert graded.value == 0.0 and graded.components["pass_to_pass"] == 1.0
    git(work, "apply", stdin=instance.patch)
    fixed = _launched(work, ["tests/test_wrap.py"], tmp_path / "fixed.json")
    assert grader.grade("", json.dumps(fixed)).value == 1.0
    # Results that are not the launcher's shape are refused, never half-read.
    for forged in ("PASSED x", '{"tests": {"a\\nPASSED b": "PASSED"}}',
                   '{"tests": {"a": "OK"}}', '{"tests": []}'):
        assert grader.grade("", forged).reason.startswith("unreadable test results"), forged
    refused = grader.grade("tampering: runner-config: pytest.ini\n", json.dumps(fixed))
    assert refused.value == 0.0 and refused.tampering
    assert refused.reason == "tampering: runner-config: pytest.ini"


SCREEN = RUN_PYTEST.with_name("screen_patch.sh")


@pytest.fixture(scope="module")
def textkit(tmp_path_factory):
    instance = read_instances(INSTANCES)[0]
    work = host_repo(instance.repo, tmp_path_factory.mktemp("screen") / "repo")
    git(work, "checkout", "-q", instance.base_commit)
    return work


@pytest.mark.parametrize("change, refused", [
    ("echo x=1 >> textkit/wrap.py; echo 1 > test.py; echo 2 > reproduce.py", None),
    ("echo 1 > textkit/json.py; echo 1 > textkit/types.py", None),  # inside a package
    ("git mv textkit/wrap.py textkit/wrapping.py", None),
    ("printf '[pytest]\\n' > .pytest.ini", "runner-config: .pytest.ini"),
    ("mkdir sub && printf '[tool:pytest]\\n' > sub/setup.cfg", "runner-config: sub/setup.cfg"),
    ("git mv textkit/wrap.py pytest.toml", "runner-config: pytest.toml"),
    ("echo 1 > textkit/conftest.py", "runner-config: textkit/conftest.py"),
    ("echo 1 > pytest.py", "runner-shadowing: pytest.py"),
    ("mkdir pluggy && echo 1 > pluggy/__init__.py", "runner-shadowing: pluggy/__init__.py"),
    ("echo 1 > tests/json.py", "runner-shadowing: tests/json.py"),  # pytest's rootdir insert
    ("mkdir x.dist-info && echo 1 > x.dist-info/entry_points.txt",
     "plugin-autoload: x.dist-info/entry_points.txt"),
    ("echo 1 > x.pth", "plugin-autoload: x.pth"),
    ("mkdir -p textkit/__pycache__ && echo 1 > textkit/__pycache__/wrap.cpython-311.pyc",
     "interpreter-startup: textkit/__pycache__/wrap.cpython-311.pyc"),
    ("echo 1 > textkit/fast.cpython-311-x86_64-linux-gnu.so",
     "interpreter-startup: textkit/fast.cpython-311-x86_64-linux-gnu.so"),
    ("echo 1 > textkit/sitecustomize.py", "interpreter-startup: textkit/sitecustomize.py"),
])
def test_the_patch_screen_refuses_what_reaches_for_the_runner(textkit, tmp_path, change,
                                                              refused):
    """Each class of the never-taken set is refused by the script test.sh runs, reading the
    patch with git apply's own parser; source changes and scratch files pass."""
    from skyrl_agent.tasks.swe.materialize import shadowed_names

    subprocess.run(["bash", "-c", change], cwd=textkit, check=True)
    git(textkit, "add", "-A", "-f")
    (tmp_path / "model.patch").write_text(git(textkit, "diff", "--cached", "--binary", "HEAD"))
    git(textkit, "reset", "-q", "--hard")
    git(textkit, "clean", "-qfdx")
    (tmp_path / "names").write_text(shadowed_names())
    done = subprocess.run(["bash", str(SCREEN), str(tmp_path / "model.patch"),
                           str(tmp_path / "names")], cwd=textkit, capture_output=True, text=True)
    if refused is None:
        assert (done.returncode, done.stdout) == (0, ""), done.stderr
    else:
        assert (done.returncode, done.stdout) == (3, f"tampering: {refused}\n"), done.stderr


def test_from_images_skips_stages_scratch_and_args():
    text = ("ARG BASE=x\nFROM python:3.12 AS build\nFROM build\nFROM scratch\nFROM ${BASE}\n"
            "FROM --platform=linux/amd64 debian:bookworm\n")
    assert from_images(parse_dockerfile(text)) == ["python:3.12", "debian:bookworm"]


def test_a_hub_dataset_loads_from_the_local_cache(tmp_path, monkeypatch):
    hub_cache(tmp_path / "hf", instance_rows())
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    listed = run("tasks", "list", "swe-bench")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.count("swe-bench/swe-mini__") == len(instance_rows())


@pytest.mark.parametrize("args", [
    ("rollout", "--agent", "openhands", "--tasks", "swe-bench"),
    ("train", "--agent", "openhands", "--tasks", "swe-bench", "--dry-run"),
    ("tasks", "check", "swe-gym", "--agent", "oracle"),
])
def test_no_dataset_is_one_line_naming_what_to_provide(tmp_path, monkeypatch, args):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf"))
    output = tmp_path / "run"
    result = run(*args, *(["--output", str(output)] if args[0] != "tasks" else []))
    assert_one_line_error(result, "not in the local Hugging Face datasets cache",
                          "JSONL or Parquet file")
    assert not output.exists()


def test_without_the_swe_extra_the_other_sets_still_list():
    blocked = ("import sys; sys.modules['swebench'] = None; "
               "from skyrl_agent.cli import main; sys.argv = ['skyrl-agent', *sys.argv[1:]]; "
               "main()")
    listed = subprocess.run([sys.executable, "-c", blocked, "tasks", "list"],
                            capture_output=True, text=True, timeout=300,
                            env={**__import__("os").environ, "COLUMNS": "250"})
    assert listed.returncode == 0, listed.stderr
    text = " ".join(listed.stdout.replace("│", " ").split())
    assert "demo 13" in text
    assert "need the swebench package: pip install 'skyrl-agent[swe]'" in text
    checked = subprocess.run([sys.executable, "-c", blocked, "tasks", "check", "swe-mini"],
                             capture_output=True, text=True, timeout=300)
    assert_one_line_error(checked, "need the swebench package")
