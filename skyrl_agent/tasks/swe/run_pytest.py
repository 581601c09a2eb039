"""The verifier's pytest launcher for SWE-format tasks (skyrl-agent).

    python3 -s run_pytest.py [--end-others] RESULTS [pytest arguments...]    cwd: the repository

`--end-others` is for a sandbox of its own (test.sh passes it): it kills every other process.

It runs in the task's image, whose Python may be old: plain syntax, standard library only.
- pytest, _pytest and pluggy are imported with the repository off sys.path, so nothing in the
  agent's tree can stand in for the runner; then the repository goes first on sys.path, as
  `python -m pytest` has it, for the code under test.
- Plug-in auto-loading is off. The image's own plug-ins (pytest11 entry points of distributions
  installed outside the repository) are loaded by name; package metadata in the repository is
  never read.
- The verdict is every test's outcome as pytest reported it, written as JSON to RESULTS when
  pytest returns; with --end-others every other process in the sandbox is then killed (test.sh
  too: the verification ends here) and the verdict written again, so a process the tests left
  cannot have the last word. Then this process ends at once (os._exit): no exit handler of the
  code under test runs after the verdict, and what the tests print is never graded.
- With HARBOR_REWARD_FILES="GRADED_TESTS_JSON REWARD_TXT" (test.sh sets it), it also writes
  the reward Harbor's verifier reads: 1 when every FAIL_TO_PASS and PASS_TO_PASS test passed.
  skyrl-agent never reads it (the host grades the results with swebench); it is there so that
  `harbor run` scores the task as we do, on Harbor's own trust in the container.
What this cannot stop: the code under test runs in this process and can misbehave here (patch
pytest's objects while its tests run, or race the results file from a thread of its own). The
verifier bounds that by what it takes from the agent (source changes only, screened by
screen_patch.sh) and says so in the threat model.
"""

import contextlib
import json
import os
import signal
import sys

STATUS = {"passed": "PASSED", "failed": "FAILED", "skipped": "SKIPPED"}
RUNNER = ("pytest", "_pytest", "pluggy")


def _inside(path, root):
    path = os.path.realpath(path or os.curdir)
    return path == root or path.startswith(root + os.sep)


def _import_runner(repo):
    """pytest's modules, imported from outside the repository (exit 4 if they cannot be)."""
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if p and not _inside(p, repo)]
    try:
        import _pytest  # noqa: F401
        import pluggy  # noqa: F401
        import pytest
    finally:
        sys.path[:] = saved
    for name in RUNNER:
        origin = getattr(sys.modules[name], "__file__", None) or ""
        if not origin or _inside(origin, repo):
            sys.stderr.write("run_pytest: %s comes from %s, not the image\n" % (name, origin))
            os._exit(4)
    return pytest


def _image_plugins(repo):
    """`-p MODULE` for each pytest11 entry point installed outside the repository."""
    try:
        from importlib import metadata
    except ImportError:  # Python < 3.8: no plug-ins loaded by name
        return []
    modules = []
    for dist in metadata.distributions():
        if _inside(str(dist.locate_file("")), repo):
            continue
        for entry in dist.entry_points:
            module = entry.value.split(":")[0].strip()
            if entry.group == "pytest11" and module not in modules:
                modules.append(module)
    return [arg for module in modules for arg in ("-p", module)]


class Recorder:
    """Each test's outcome as pytest decides it: the worst of its phases, as its summary
    shows them (an error in setup or teardown is ERROR; an expected failure is XFAIL; an
    unexpected pass is left out, as swebench's log parser leaves it)."""

    def __init__(self):
        self.status = {}

    def pytest_runtest_logreport(self, report):
        xfail = hasattr(report, "wasxfail")
        if report.when == "call":
            if xfail:
                if report.skipped:
                    self.status[report.nodeid] = "XFAIL"
                return
            self.status[report.nodeid] = STATUS[report.outcome]
        elif report.failed:
            self.status[report.nodeid] = "ERROR"
        elif report.skipped and report.when == "setup":
            self.status[report.nodeid] = "SKIPPED"

    def pytest_collectreport(self, report):
        if report.failed:
            self.status[report.nodeid] = "ERROR"


def _end_every_other_process():
    """SIGKILL every process this one may signal but itself (the sandbox's init is spared by
    the kernel): test.sh and anything the code under test left running, before the results
    exist, so no process can rewrite them after the verdict."""
    with contextlib.suppress(OSError):
        os.kill(-1, signal.SIGKILL)


def _write(path, text):
    staging = path + ".writing"
    with open(staging, "w") as handle:
        handle.write(text)
    os.replace(staging, path)


def _write_harbor_reward(status, graded, reward):
    with open(graded) as handle:
        wanted = json.load(handle)
    names = wanted["FAIL_TO_PASS"] + wanted["PASS_TO_PASS"]
    resolved = bool(names) and all(status.get(name) in ("PASSED", "XFAIL") for name in names)
    _write(reward, "1\n" if resolved else "0\n")


def main():
    end_others = sys.argv[1:2] == ["--end-others"]
    argv = sys.argv[2:] if end_others else sys.argv[1:]
    if not argv:
        sys.stderr.write("usage: run_pytest.py [--end-others] RESULTS [pytest arguments...]\n")
        os._exit(2)
    results, args = argv[0], argv[1:]
    harbor = os.environ.pop("HARBOR_REWARD_FILES", "").split()  # read before any test runs
    repo = os.path.realpath(os.getcwd())
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    pytest = _import_runner(repo)
    plugins = _image_plugins(repo)
    sys.path.insert(0, repo)
    recorder = Recorder()
    code = pytest.main(plugins + args, plugins=[recorder])
    verdict = json.dumps({"exit_code": int(code), "tests": recorder.status})
    _write(results, verdict)  # before test.sh ends: the host may end this process after it
    if end_others:
        _end_every_other_process()
        _write(results, verdict)  # whatever raced the first write, nothing is left to race this
    if len(harbor) == 2:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            _write_harbor_reward(recorder.status, *harbor)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(code))


if __name__ == "__main__":
    main()
