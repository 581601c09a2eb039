"""The `swebench` package's harness, used as it is: test specs, eval scripts, image names, log
parsers and the resolved/unresolved verdict.

Repos swebench has no spec for (the bundled swe-mini repos, and e.g. most SWE-Gym repos) are
registered in its own maps as plain pytest repos: `pytest -rA` on the test files of the test
patch, graded by swebench's pytest log parser. That is honest for swe-mini, whose repos are
plain pytest projects; for another repo it is a guess, and loading says so once per repo.
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass, replace
from typing import Any

from skyrl_agent.errors import TaskError
from skyrl_agent.tasks.spec import CHALLENGE_FILE
from skyrl_agent.tasks.swe.challenge import Challenge, new_challenge, twin_tests
from skyrl_agent.tasks.swe.instance import SweInstance
from skyrl_agent.types import TAMPERING, Reward

log = logging.getLogger(__name__)
ENV_NAME = "testbed"
TESTBED = "/testbed"
TEST_OUTPUT = "/logs/verifier/test-output.txt"
"""Where the test command's own output goes, apart from test.sh's log (graded unless the tests
run under run_pytest.py)."""
TEST_RESULTS = "/logs/verifier/test-results.json"
"""Each test's outcome as run_pytest.py recorded it: the file graded for repos run with pytest."""
RUNNER = "/tests/run_pytest.py"
"""The verifier's pytest launcher in the verification sandbox (tasks/swe/run_pytest.py)."""
PYTEST_CMD = "python3 -m pytest -rA -p no:cacheprovider"
"""Test command of repos swebench has no spec for."""
_PYTEST_STARTS = ("pytest ", "python -m pytest ", "python3 -m pytest ")
MAX_RESULTS = 200_000
"""More test outcomes than any repo's test files hold: the results file is refused past it."""
STATUSES = frozenset({"PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL"})
_CONDA_LINES = ("source /opt/miniconda3/bin/activate", f"conda activate {ENV_NAME}")


def require_swebench() -> None:
    """The swebench package is an extra: say how to install it, once, as a TaskError."""
    try:
        import swebench.harness.constants  # noqa: F401 - the first use pays the import
    except ImportError:
        raise TaskError("SWE-bench-format tasks need the swebench package: pip install "
                        "'skyrl-agent[swe]'") from None


def ensure_spec(repo: str, version: str, known_local: bool) -> bool:
    """Make sure swebench has a test spec and a log parser for (repo, version), registering the
    pytest one where it has none; True when it was registered here. `known_local`: the repo is
    one of ours (no warning)."""
    require_swebench()
    from swebench.harness.constants import MAP_REPO_TO_EXT, MAP_REPO_VERSION_TO_SPECS
    from swebench.harness.log_parsers import MAP_REPO_TO_PARSER
    from swebench.harness.log_parsers.python import parse_log_pytest

    if version in MAP_REPO_VERSION_TO_SPECS.get(repo, {}) and repo in MAP_REPO_TO_PARSER:
        return False
    MAP_REPO_VERSION_TO_SPECS.setdefault(repo, {})[version] = {"python": "3",
                                                                "test_cmd": PYTEST_CMD}
    MAP_REPO_TO_EXT[repo] = "py"
    MAP_REPO_TO_PARSER.setdefault(repo, parse_log_pytest)
    if not known_local:
        _warn_guessed(repo, version)
    return True


@functools.cache
def _warn_guessed(repo: str, version: str) -> None:
    log.warning("swebench has no test spec for %s %s: running `%s` on the test patch's files, "
                "graded with swebench's pytest parser", repo, version, PYTEST_CMD)


def _test_spec(instance: SweInstance, eval_lines: list[str], namespace: str | None) -> Any:
    from swebench.harness.constants import MAP_REPO_TO_EXT
    from swebench.harness.test_spec.test_spec import TestSpec

    return TestSpec(
        instance_id=instance.instance_id, repo=instance.repo, version=instance.version,
        repo_script_list=[], eval_script_list=eval_lines, env_script_list=[], arch="x86_64",
        FAIL_TO_PASS=list(instance.fail_to_pass), PASS_TO_PASS=list(instance.pass_to_pass),
        language=MAP_REPO_TO_EXT[instance.repo], docker_specs={},
        namespace=namespace)


def as_swebench(instance: SweInstance) -> dict[str, Any]:
    """The instance as swebench's functions take it (its column names)."""
    return {**instance.model_dump(exclude={"fail_to_pass", "pass_to_pass"}),
            "FAIL_TO_PASS": list(instance.fail_to_pass),
            "PASS_TO_PASS": list(instance.pass_to_pass)}


def _test_cmd(instance: SweInstance) -> str:
    from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS

    command = MAP_REPO_VERSION_TO_SPECS[instance.repo][instance.version]["test_cmd"]
    return command if isinstance(command, str) else " ".join(command)


def runs_under_runner(instance: SweInstance) -> bool:
    """Whether the instance's tests run with pytest, started by the verifier's launcher and
    graded from its results file (other runners, e.g. django's runtests.py, from their log)."""
    return _test_cmd(instance).startswith(_PYTEST_STARTS)


def install_line(instance: SweInstance) -> str | None:
    """The repo's install command, which swebench's eval script runs on the patched tree; the
    verifier runs it before the agent's patch is applied instead, so that none of the agent's
    code (its setup.py) runs before the launcher has read the challenge."""
    from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS

    install = MAP_REPO_VERSION_TO_SPECS[instance.repo][instance.version].get("install")
    return install if isinstance(install, str) else None


def eval_lines(instance: SweInstance, conda: bool) -> list[str]:
    """swebench's eval script for the instance (reset the test files, apply the test patch, run
    the test command between its output markers, reset again), without the conda lines when
    the image has no conda (our local base image), without the install line (run before the
    agent's patch: install_line), pytest started by run_pytest.py."""
    from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS
    from swebench.harness.test_spec.create_scripts import make_eval_script_list

    specs = MAP_REPO_VERSION_TO_SPECS[instance.repo][instance.version]
    lines = make_eval_script_list(
        as_swebench(instance), specs, ENV_NAME, TESTBED, instance.base_commit,
        instance.test_patch)
    lines = lines if conda else [line for line in lines if line not in _CONDA_LINES]
    lines = [line for line in lines if line != install_line(instance)]
    if runs_under_runner(instance):
        lines = _pytest_under_runner(lines, _test_cmd(instance))
    return _tests_to_their_own_file(lines)


def _pytest_under_runner(lines: list[str], test_cmd: str) -> list[str]:
    """The test command's line with pytest started by run_pytest.py (which writes
    TEST_RESULTS) instead of `pytest` or `python -m pytest`."""
    start = next(s for s in _PYTEST_STARTS if test_cmd.startswith(s))
    launcher = (f"rm -f {TEST_RESULTS}; python3 -s {RUNNER} --end-others --challenge "
                f"{CHALLENGE_FILE} {TEST_RESULTS} ")
    replaced = [launcher + line[len(start):] if line.startswith(test_cmd) else line
                for line in lines]
    if replaced == lines:
        raise TaskError("swebench's eval script has no line running its test command here")
    return replaced


def _tests_to_their_own_file(lines: list[str]) -> list[str]:
    """The commands between swebench's output markers write to TEST_OUTPUT alone, so nothing
    else the script prints (file names of the agent's patch, its diff) can pass for test
    results, and the host can defuse markers the tests themselves print."""
    from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT
    try:
        start = lines.index(f": '{START_TEST_OUTPUT}'")
        end = lines.index(f": '{END_TEST_OUTPUT}'", start)
    except ValueError:
        raise TaskError("swebench's eval script has no test output markers here") from None
    return [*lines[:start + 1], "{", *lines[start + 1:end], f"}} > {TEST_OUTPUT} 2>&1",
            *lines[end:]]


def test_patch_files(instance: SweInstance) -> list[str]:
    """Every path the test patch touches (old and new names)."""
    from unidiff import PatchSet
    paths: set[str] = set()
    for patched in PatchSet(instance.test_patch):
        for name in (patched.source_file, patched.target_file):
            if name.startswith(("a/", "b/")):
                paths.add(name[2:])
    return sorted(paths)


def image_name(instance: SweInstance, namespace: str) -> str:
    """The instance's evaluation image: swebench's name for it under `namespace`; the SWE-Gym
    images (namespace xingyaoww) spell the `__` of an id as `_s_`."""
    if namespace == "xingyaoww":
        return f"{namespace}/sweb.eval.x86_64.{instance.instance_id.lower()}".replace(
            "__", "_s_") + ":latest"
    return str(_test_spec(instance, [], namespace).instance_image_key)


def results_from(text: str) -> tuple[dict[str, object], dict[str, str]]:
    """run_pytest.py's results file and its main run as {test: status}; ValueError unless it is
    the launcher's shape: a JSON object whose `tests` maps test ids (one line each) to pytest
    statuses."""
    data = json.loads(text)
    tests = data.get("tests") if isinstance(data, dict) else None
    if not isinstance(tests, dict) or len(tests) > MAX_RESULTS:
        raise ValueError("not a results object")
    for name, status in tests.items():
        if status not in STATUSES or not name.isprintable() or not name.strip():
            raise ValueError(f"a result is not a test id and a status: {name[:100]!r}")
    return data, tests


def tampering_line(script_log: str) -> str | None:
    """What screen_patch.sh refused, from test.sh's log (it ends the script before any of the
    agent's code could print)."""
    return next((line.removeprefix(f"{TAMPERING}: ") for line in script_log.splitlines()
                 if line.startswith(f"{TAMPERING}: ")), None)


@dataclass(frozen=True)
class SweGrader:
    """The verdict on a verification, computed on the host with swebench's grading: resolved
    when every FAIL_TO_PASS test passes and every PASS_TO_PASS test still does."""

    instance: SweInstance
    """The instance graded (its repo, version and test lists)."""
    local_repo: bool
    """The repo is one of ours, registered as a pytest repo without a warning."""
    structured: bool = False
    """The tests run under run_pytest.py: graded from its results file, never from output."""
    challenged: bool = True
    """Each verification gets a fresh challenge (challenge.py): a nonce, tripwires and isolated
    runs. Off only to measure what it costs."""
    twin: bool = False
    """An impossible twin: its FAIL_TO_PASS tests are made to fail whatever the change."""

    def impossible_twin(self) -> SweGrader | None:
        """This grader for the instance's impossible twin (None when no FAIL_TO_PASS test can
        be made impossible: a twin needs a module-level one and the launcher)."""
        if not self.structured or not twin_tests(self.instance.fail_to_pass):
            return None
        return replace(self, twin=True, challenged=True)

    def challenge(self) -> Challenge | None:
        """A fresh challenge for one verification (None where the tests do not run under
        run_pytest.py)."""
        if not (self.structured and self.challenged):
            return None
        ensure_spec(self.instance.repo, self.instance.version, self.local_repo)
        command = _test_cmd(self.instance)
        stops_early = any(flag in command.split() for flag in ("-x", "--exitfirst")) or (
            "--maxfail" in command)
        return new_challenge(self.instance.fail_to_pass, self.instance.pass_to_pass,
                             tripwires=not stops_early, twin=self.twin)

    @property
    def test_output(self) -> str:
        """The file graded: the launcher's results, or the test command's own output."""
        return TEST_RESULTS if self.structured else TEST_OUTPUT

    def grade(self, script_log: str, test_output: str | None,
              challenge: Challenge | None = None) -> Reward:
        from swebench.harness.constants import APPLY_PATCH_FAIL

        refused = tampering_line(script_log)
        if refused is not None:
            return Reward.tampered(refused[:300])
        if APPLY_PATCH_FAIL in script_log:
            return Reward.failed("the agent's patch did not apply")
        if test_output is None:
            return Reward.failed("the tests did not run (no test output)")
        ensure_spec(self.instance.repo, self.instance.version, self.local_repo)
        if self.structured:
            try:
                results, status = results_from(test_output)
            except ValueError as exc:
                return Reward.failed(f"unreadable test results: {exc}")
            if challenge is not None:
                status, forged = challenge.judge(results)
                if forged is not None:
                    return Reward.tampered(forged)
            # The repo's own parser names the tests, as it would from pytest's -rA lines.
            test_output = "".join(f"{state} {name}\n" for name, state in status.items())
        return self._verdict(test_output)

    def _verdict(self, test_output: str) -> Reward:
        from swebench.harness.constants import (
            END_TEST_OUTPUT,
            FAIL_ONLY_REPOS,
            FAIL_TO_PASS,
            KEY_INSTANCE_ID,
            PASS_TO_PASS,
            START_TEST_OUTPUT,
            EvalType,
            ResolvedStatus,
        )
        from swebench.harness.grading import (
            compute_fail_to_pass,
            compute_pass_to_pass,
            get_eval_tests_report,
            get_resolution_status,
        )
        from swebench.harness.log_parsers import MAP_REPO_TO_PARSER

        # Markers printed by the code under test must not move the graded region.
        defused = test_output.replace(START_TEST_OUTPUT, "[marker]").replace(
            END_TEST_OUTPUT, "[marker]")
        spec = _test_spec(self.instance, [], None)
        status = MAP_REPO_TO_PARSER[self.instance.repo](defused, spec)
        if not status:
            last = next((line for line in reversed(defused.splitlines()) if line.strip()), "")
            return Reward.failed(f"no test results in the test output: {last.strip()[:200]}")
        reference = {KEY_INSTANCE_ID: self.instance.instance_id,
                     FAIL_TO_PASS: list(self.instance.fail_to_pass),
                     PASS_TO_PASS: list(self.instance.pass_to_pass)}
        kind = (EvalType.FAIL_ONLY if self.instance.repo in FAIL_ONLY_REPOS
                else EvalType.PASS_AND_FAIL)
        report = get_eval_tests_report(status, reference, eval_type=kind)
        resolved = 1.0 if get_resolution_status(report) == ResolvedStatus.FULL.value else 0.0
        return Reward(resolved, {
            "reward": resolved,
            "fail_to_pass": float(compute_fail_to_pass(report)),
            "pass_to_pass": float(compute_pass_to_pass(report))})
