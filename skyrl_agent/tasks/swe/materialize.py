"""One SWE-bench-format instance as a Harbor task directory in the project cache.

Written once per instance content (a content hash names the folder), so every command runs it
through the one episode lifecycle unchanged: `tasks check`, `rollout`, `train`, `eval --regrade`.

    task.toml                 separate-mode verification; the only artifact is the agent's patch
    instruction.md            the problem statement
    environment/Dockerfile    /testbed at base_commit, history past it removed (prepare_testbed.sh):
                              FROM the instance's SWE-bench image, or, for a repo that ships as a
                              git fast-import stream (swe-mini), FROM the local base image
    tests/test.sh             screen the agent's patch (screen_patch.sh), apply it (not its
                              test files) to the pristine /testbed, then swebench's eval script
                              with pytest started by run_pytest.py; the host grades the results
    solution/solve.sh         apply the gold patch

Why the patch and not /testbed: the verifier starts from the pristine image and takes only the
agent's `git diff` (made by `[[verifier.collect]]` after its processes are dead), the way
SWE-bench grades a model patch. A repo's tree with its build outputs can pass the artifact
limits, and the agent's `.git` (hooks, config) never reaches the verifier.

What the verifier never takes (tasks/swe/screen_patch.sh): a patch that touches the test runner's
configuration, package metadata pytest or site would load, interpreter start-up or compiled
code, or a new module that shadows the runner or the standard library scores 0 as `tampering`.
Changes to test files are dropped, as SWE-bench's own harness drops them: the tests come from
the test patch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shlex
import sys
from pathlib import Path

from skyrl_agent.atomic import atomic_folder
from skyrl_agent.config import cache_dir
from skyrl_agent.tasks.spec import TaskSpec, load_task
from skyrl_agent.tasks.swe.harness import (
    SweGrader,
    ensure_spec,
    eval_lines,
    image_name,
    install_line,
    runs_under_runner,
    test_patch_files,
)
from skyrl_agent.tasks.swe.instance import SweInstance

LOCAL_BASE_IMAGE = "skyrl-agent/base:bookworm"
"""What a repo shipped as a stream is built on (python3, pytest and git; scripts/)."""
MODEL_PATCH = "/skyrl/swe/model.patch"
"""Where the agent's changes are written after it stops; the task's only artifact."""
PREPARE = Path(__file__).with_name("prepare_testbed.sh")
VERIFIER_FILES = ("screen_patch.sh", "screen_source.py", "run_pytest.py", "plant_tripwires.py")
VERIFIER_LOGS = "/logs/verifier"
HARBOR_REWARD = f"{VERIFIER_LOGS}/reward.txt"
GRADED_TESTS = "graded-tests.json"
"""The tests run_pytest.py requires to pass for the reward Harbor's verifier reads."""
"""The verifier's own scripts beside this module, shipped in each task's tests/."""
TEST_FILES = ("tests/*", "*/tests/*", "test_*.py", "*/test_*.py", "*_test.py", "*/*_test.py",
              "tests.py", "*/tests.py")
"""Paths whose changes in the agent's patch are dropped (git apply --exclude patterns, where
`*` crosses folders): test files. The runner's configuration is screened out as tampering."""
RUNNER_MODULES = ("pytest", "_pytest", "pluggy", "py", "iniconfig", "packaging", "exceptiongroup",
                  "tomli", "attr", "attrs", "more_itertools", "atomicwrites", "colorama",
                  "importlib_metadata", "zipp", "typing_extensions", "_virtualenv",
                  "sitecustomize", "usercustomize", "distutils", "imp", "asynchat", "asyncore",
                  "smtpd")
"""Modules the runner imports (and standard modules older Pythons have) that a patch may not
add where Python looks first."""
HARMLESS_NAMES = frozenset({"test", "this", "antigravity", "idlelib", "turtledemo",
                            "__hello__", "__phello__"})
"""Standard-library names nothing in the runner imports; agents name scratch files so."""
COLLECT = " && ".join([
    f"rm -rf {MODEL_PATCH}", f"mkdir -p {os.path.dirname(MODEL_PATCH)}", "cd /testbed",
    "base=$(cat /skyrl/swe/head)", "snap=$(mktemp -d)",
    "[ -d .git/objects ] && [ ! -L .git ] && [ ! -L .git/objects ]",
    'cp -R -P .git/objects "$snap/objects"', 'rm -rf "$snap/objects/info"',
    'find "$snap" ! -type f ! -type d -delete', 'mkdir "$snap/refs"',
    'echo "$base" > "$snap/HEAD"',
    "g() { env -i PATH=/usr/bin:/bin HOME=\"$snap\" GIT_DIR=\"$snap\" GIT_WORK_TREE=/testbed "
    "GIT_INDEX_FILE=\"$snap/index\" GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null "
    "GIT_ATTR_NOSYSTEM=1 GIT_NO_REPLACE_OBJECTS=1 git -c core.fsmonitor=false "
    "-c core.hooksPath=/dev/null -c core.attributesFile=/dev/null -c safe.directory='*' "
    '"$@"; }',
    'g read-tree "$base"', "g add -A .",
    f'g diff --cached --binary --no-ext-diff --no-textconv "$base" > {MODEL_PATCH}',
    'rm -rf "$snap"'])
"""Run in the agent's sandbox after its processes are killed: its changes since the base commit
as one patch. git reads a copy of the object store (no alternates) with a fresh index and a
configuration of its own, so nothing in the agent's `.git` (config, filters, hooks, commondir)
names a program that runs here, past the agent's time."""


@dataclasses.dataclass(frozen=True)
class Origin:
    """Where an instance's repository comes from."""

    repo_stream: Path | None
    """A git fast-import stream of the repo (built on the local base image), or None: the
    instance's own SWE-bench image."""
    image_namespace: str = "swebench"
    """Registry namespace of the instance images (when repo_stream is None)."""


def _toml(value: object) -> str:
    # JSON strings, numbers and lists are valid TOML values.
    return json.dumps(value)


def task_toml(instance: SweInstance, name: str, local: bool) -> str:
    agent_s, verifier_s, memory = (600, 180, 1024) if local else (1800, 1800, 4096)
    metadata = {"category": "swe", "repo": instance.repo, "instance_id": instance.instance_id,
                "base_commit": instance.base_commit, "version": instance.version}
    return "\n".join([
        'schema_version = "1.4"', f"artifacts = {_toml([MODEL_PATCH])}", "",
        "[task]", f"name = {_toml(name)}",
        f"description = {_toml(f'Resolve issue {instance.instance_id} of {instance.repo}.')}", "",
        "[metadata]", *(f"{key} = {_toml(value)}" for key, value in metadata.items()), "",
        "[agent]", f"timeout_sec = {agent_s}", "",
        "[verifier]", f"timeout_sec = {verifier_s}", 'environment_mode = "separate"', "",
        "[[verifier.collect]]", f"command = {_toml(COLLECT)}", "timeout_sec = 300", "",
        "[environment]", 'workdir = "/testbed"', "cpus = 1", f"memory_mb = {memory}",
        'network_mode = "no-network"', ""])


def instruction(instance: SweInstance) -> str:
    return ("The repository is checked out in /testbed. Resolve the issue below by changing "
            "its source code; tests that check the fix are run afterwards.\n\n"
            f"{instance.problem_statement.strip()}\n")


def dockerfile(instance: SweInstance, origin: Origin) -> str:
    if origin.repo_stream is not None:
        return "\n".join([
            f"FROM {LOCAL_BASE_IMAGE}", "COPY repo.fi prepare_testbed.sh /skyrl/swe/",
            f"RUN bash /skyrl/swe/prepare_testbed.sh --import /skyrl/swe/repo.fi "
            f"{instance.base_commit}", "WORKDIR /testbed", ""])
    return "\n".join([
        f"FROM {image_name(instance, origin.image_namespace)}",
        "COPY prepare_testbed.sh /skyrl/swe/", "RUN bash /skyrl/swe/prepare_testbed.sh",
        "WORKDIR /testbed", ""])


def shadowed_names() -> str:
    """The module names screen_patch.sh refuses as new top-level modules, one a line."""
    names = (set(sys.stdlib_module_names) | set(RUNNER_MODULES)) - HARMLESS_NAMES
    return "".join(f"{name}\n" for name in sorted(names))


def test_sh(instance: SweInstance, local: bool) -> str:
    from swebench.harness.constants import APPLY_PATCH_FAIL, APPLY_PATCH_PASS

    excludes = " ".join(f"--exclude={shlex.quote(p)}"
                        for p in (*test_patch_files(instance), *TEST_FILES))
    return "\n".join([
        "#!/bin/bash",
        f"# Verification of {instance.instance_id} (generated by skyrl-agent). It runs in a fresh",
        "# sandbox of the pristine image; the agent's work arrives only as its patch, screened",
        "# before any of it is applied (a patch that reaches for the test runner is tampering).",
        "# Changes to test files are not applied; the tests come from the test patch in",
        "# swebench's eval script below. The host grades the test results.",
        *(harbor_reward_lines() if runs_under_runner(instance) else []),
        "cd /testbed",
        *_install_before_patch(instance, local),
        f"patch={MODEL_PATCH}",
        'if [ -f "$patch" ] && [ ! -L "$patch" ] && [ -s "$patch" ]; then',
        '  bash /tests/screen_patch.sh "$patch" /tests/shadowed-names.txt; screened=$?',
        '  if [ $screened = 3 ]; then rm -f "$patch"; exit 0; fi',
        f'  if [ $screened = 0 ] && git apply -v --binary --whitespace=nowarn {excludes} \\',
        '       "$patch"; then',
        '    python3 -s /tests/screen_source.py "$patch"; screened=$?',
        '    if [ $screened = 3 ]; then rm -f "$patch"; exit 0; fi',
        f"    if [ $screened != 0 ]; then echo '{APPLY_PATCH_FAIL}'; exit 0; fi",
        f"    echo '{APPLY_PATCH_PASS}'",
        "  else",
        f"    echo '{APPLY_PATCH_FAIL}'; exit 0",
        "  fi",
        "else",
        "  echo 'no changes from the agent'",
        "fi",
        'rm -f "$patch"',
        "set -uxo pipefail",
        *eval_lines(instance, conda=not local), ""])


def _install_before_patch(instance: SweInstance, local: bool) -> list[str]:
    """The repo's install command on the pristine tree (swebench runs it on the patched one):
    the agent's setup.py never runs, let alone before the launcher."""
    install = install_line(instance)
    if install is None:
        return []
    conda = "" if local else "source /opt/miniconda3/bin/activate && conda activate testbed && "
    return [f"( {conda}{install} ) > /dev/null 2>&1"]


def harbor_reward_lines() -> list[str]:
    """What makes run_pytest.py write the reward file Harbor's verifier reads (0 until the
    tests have run); skyrl-agent never reads it."""
    return ["# The reward file is for Harbor's verifier (`harbor run`) only.",
            f"mkdir -p {VERIFIER_LOGS} && echo 0 > {HARBOR_REWARD}",
            f"export HARBOR_REWARD_FILES='/tests/{GRADED_TESTS} {HARBOR_REWARD}'"]


def graded_tests(instance: SweInstance) -> str:
    """The instance's test lists as run_pytest.py reads them for Harbor's reward (a fail-only
    repo's PASS_TO_PASS is not graded, as swebench does)."""
    from swebench.harness.constants import FAIL_ONLY_REPOS

    keep = instance.repo not in FAIL_ONLY_REPOS
    return json.dumps({"FAIL_TO_PASS": list(instance.fail_to_pass),
                       "PASS_TO_PASS": list(instance.pass_to_pass) if keep else []})


def solve_sh() -> str:
    return ("#!/bin/bash\n# The gold patch of the instance.\nset -euo pipefail\ncd /testbed\n"
            "git apply -v --binary /solution/gold.patch\n")


def task_files(instance: SweInstance, name: str, origin: Origin) -> dict[str, bytes]:
    """Every file of the instance's task folder, by relative path."""
    local = origin.repo_stream is not None
    files = {
        "task.toml": task_toml(instance, name, local),
        "instruction.md": instruction(instance),
        "environment/Dockerfile": dockerfile(instance, origin),
        "tests/test.sh": test_sh(instance, local),
        "solution/solve.sh": solve_sh(),
        "solution/gold.patch": instance.patch,
    }
    out = {path: text.encode() for path, text in files.items()}
    out["environment/prepare_testbed.sh"] = PREPARE.read_bytes()
    out["tests/shadowed-names.txt"] = shadowed_names().encode()
    out[f"tests/{GRADED_TESTS}"] = graded_tests(instance).encode()
    for script in VERIFIER_FILES:
        out[f"tests/{script}"] = PREPARE.with_name(script).read_bytes()
    if origin.repo_stream is not None:
        out["environment/repo.fi"] = origin.repo_stream.read_bytes()
    return out


def _digest(files: dict[str, bytes]) -> str:
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
    return digest.hexdigest()[:24]


def _write(root: Path, files: dict[str, bytes]) -> None:
    for relative, data in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def materialize(instance: SweInstance, name: str, origin: Origin) -> TaskSpec:
    """The instance's task (written to the cache unless it is there), graded by swebench."""
    local = origin.repo_stream is not None
    ensure_spec(instance.repo, instance.version, known_local=local)
    files = task_files(instance, name, origin)
    cache = cache_dir() / "swe-tasks"
    folder = cache / _digest(files)  # named by content: a changed instance gets a new folder
    if not (folder / "task.toml").is_file():
        with atomic_folder(folder) as staging:  # first writer wins: concurrent ones agree
            _write(staging, files)
    grader = SweGrader(instance, local, structured=runs_under_runner(instance))
    return dataclasses.replace(load_task(folder), grader=grader)
