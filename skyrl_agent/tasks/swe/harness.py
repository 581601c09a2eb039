"""The `swebench` package's harness, used as it is: test specs, eval scripts, image names, log
parsers and the resolved/unresolved verdict.

Repos swebench has no spec for (the bundled swe-mini repos, and e.g. most SWE-Gym repos) are
registered in its own maps as plain pytest repos: `pytest -rA` on the test files of the test
patch, graded by swebench's pytest log parser. That is honest for swe-mini, whose repos are
plain pytest projects; for another repo it is a guess, and loading says so once per repo.
"""

from __future__ import annotations

import functools
import logging
import tempfile
from dataclasses import dataclass
from typing import Any

from skyrl_agent.errors import TaskError
from skyrl_agent.tasks.swe.instance import SweInstance
from skyrl_agent.types import Reward

log = logging.getLogger(__name__)
ENV_NAME = "testbed"
TESTBED = "/testbed"
TEST_OUTPUT = "/logs/verifier/test-output.txt"
"""Where the test command's own output goes (graded), apart from test.sh's log."""
PYTEST_CMD = "python3 -m pytest -rA -p no:cacheprovider"
"""Test command of repos swebench has no spec for."""
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


def eval_lines(instance: SweInstance, conda: bool) -> list[str]:
    """swebench's eval script for the instance (reset the test files, apply the test patch, run
    the test command between its output markers, reset again), without the conda lines when
    the image has no conda (our local base image)."""
    from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS
    from swebench.harness.test_spec.create_scripts import make_eval_script_list

    specs = MAP_REPO_VERSION_TO_SPECS[instance.repo][instance.version]
    lines = make_eval_script_list(
        as_swebench(instance), specs, ENV_NAME, TESTBED, instance.base_commit,
        instance.test_patch)
    lines = lines if conda else [line for line in lines if line not in _CONDA_LINES]
    return _tests_to_their_own_file(lines)


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


@dataclass(frozen=True)
class SweGrader:
    """The verdict on a verification log, computed on the host with swebench's grading:
    resolved when every FAIL_TO_PASS test passes and every PASS_TO_PASS test still does."""

    instance: SweInstance
    """The instance graded (its repo, version and test lists)."""
    local_repo: bool
    """The repo is one of ours, registered as a pytest repo without a warning."""

    test_output: str = TEST_OUTPUT
    """The file graded, written by the test command alone."""

    def grade(self, script_log: str, test_output: str | None) -> Reward:
        from swebench.harness.constants import (
            APPLY_PATCH_FAIL,
            END_TEST_OUTPUT,
            START_TEST_OUTPUT,
        )
        from swebench.harness.grading import (
            compute_fail_to_pass,
            compute_pass_to_pass,
            get_eval_report,
        )
        from swebench.harness.log_parsers import MAP_REPO_TO_PARSER

        if APPLY_PATCH_FAIL in script_log:
            return Reward.failed("the agent's patch did not apply")
        if test_output is None:
            return Reward.failed("the tests did not run (no test output)")
        ensure_spec(self.instance.repo, self.instance.version, self.local_repo)
        # Markers printed by the code under test must not move the graded region.
        defused = test_output.replace(START_TEST_OUTPUT, "[marker]").replace(
            END_TEST_OUTPUT, "[marker]")
        spec = _test_spec(self.instance, [], None)
        if not MAP_REPO_TO_PARSER[self.instance.repo](defused, spec):
            last = next((line for line in reversed(defused.splitlines()) if line.strip()), "")
            return Reward.failed(f"no test results in the test output: {last.strip()[:200]}")
        log = f"{START_TEST_OUTPUT}\n{defused}\n{END_TEST_OUTPUT}\n"
        prediction = {"instance_id": self.instance.instance_id,
                      "model_name_or_path": "agent", "model_patch": "(the agent's changes)"}
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".log") as handle:
            handle.write(log)
            handle.flush()
            report = get_eval_report(spec, prediction, handle.name,
                                     include_tests_status=True)
        verdict = report[self.instance.instance_id]
        if not verdict["patch_successfully_applied"]:
            return Reward.failed("the test output could not be graded")
        status = verdict["tests_status"]
        resolved = 1.0 if verdict["resolved"] else 0.0
        return Reward(resolved, {
            "reward": resolved,
            "fail_to_pass": float(compute_fail_to_pass(status)),
            "pass_to_pass": float(compute_pass_to_pass(status))})
