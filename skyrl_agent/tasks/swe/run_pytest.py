"""The verifier's pytest launcher for SWE-format tasks (skyrl-agent).

    python3 -s run_pytest.py [--end-others] [--challenge FILE] RESULTS [pytest args...]
                                                                    cwd: the repository

It runs in the task's image, whose Python may be old: plain syntax, standard library only.

This process (the launcher) never imports pytest or the repository: the code under test runs
only in children it starts, and cannot reach the verdict the launcher writes.
- The challenge FILE (written by the host for this verification, read and deleted before any
  child starts) holds a nonce, tripwire tests to plant beside the real ones
  (plant_tripwires.py) and the tests to run again, each alone in a fresh process.
- The main child runs pytest with the given arguments; each isolated child runs one test. Each
  child gets a secret of its own on stdin before the repository is imported, and reports
  "SECRET OUTCOME" on a pipe: a child that ends early, or code that writes there without the
  secret, reports nothing.
- pytest, _pytest and pluggy are imported (in a child) with the repository off sys.path, so
  nothing in the agent's tree can stand in for the runner; then the repository goes first on
  sys.path, as `python -m pytest` has it. Plug-in auto-loading is off; the image's own plug-ins
  (pytest11 entry points of distributions outside the repository) are loaded by name.
- RESULTS gets {"nonce", "exit_code", "tests": main run, "isolated": one test a process}. With
  --end-others (a sandbox of its own: test.sh passes it) every other process is killed before
  the last write, so nothing the tests left can have the last word; then this process ends at
  once (os._exit) and what the tests print is never graded. The host judges the file: a wrong
  nonce, a tripwire reported wrongly, or an isolated run that disagrees fails the sample.
- With HARBOR_REWARD_FILES="GRADED_TESTS_JSON REWARD_TXT" (test.sh sets it), it also writes
  the reward Harbor's verifier reads: 1 when every FAIL_TO_PASS and PASS_TO_PASS test passed
  (for `harbor run`, on Harbor's own trust in the container; skyrl-agent never reads it).
What remains: code under test runs in the children and can subvert pytest there; the tripwires
catch a forgery that does not tell them from real tests, the isolation one that needs the
whole run, and the host's screen (screen_source.py) the usual ways to reach the runner.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys

STATUS = {"passed": "PASSED", "failed": "FAILED", "skipped": "SKIPPED"}
RUNNER = ("pytest", "_pytest", "pluggy")
ISOLATED_TIMEOUT_S = 120


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


def child(report_fd, args, one=None):
    """A child: read the secret, run pytest, report "SECRET OUTCOME" on report_fd."""
    secret = sys.stdin.readline().strip()
    repo = os.path.realpath(os.getcwd())
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    pytest = _import_runner(repo)
    plugins = _image_plugins(repo)
    sys.path.insert(0, repo)
    recorder = Recorder()
    code = int(pytest.main(plugins + args + ([one] if one else []), plugins=[recorder]))
    outcome = recorder.status.get(one, "MISSING") if one else {
        "exit_code": code, "tests": recorder.status}
    os.write(report_fd, ("%s %s\n" % (secret, json.dumps(outcome))).encode())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _run_child(mode_args, quiet, timeout=None):
    """Start this script as a child, hand it a fresh secret, return its report (None when it
    gave none: ended early, timed out, or wrote without the secret)."""
    secret = os.urandom(16).hex()
    read_end, write_end = os.pipe()
    sink = open(os.devnull, "w") if quiet else None
    process = subprocess.Popen(
        [sys.executable, "-s", os.path.abspath(__file__), "--report", str(write_end)]
        + mode_args, stdin=subprocess.PIPE, stdout=sink, stderr=sink, pass_fds=(write_end,),
        start_new_session=True)
    os.close(write_end)
    try:
        process.communicate((secret + "\n").encode(), timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(OSError):  # the child's group: what it left goes with it
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    if sink is not None:
        sink.close()
    return _report(read_end, secret)


def _report(read_end, secret):
    os.set_blocking(read_end, False)  # a process the child left may hold the pipe open
    data = b""
    with contextlib.suppress(OSError):
        while len(data) < 64 * 1024 * 1024:
            chunk = os.read(read_end, 1 << 16)
            if not chunk:
                break
            data += chunk
    os.close(read_end)
    for line in data.decode(errors="replace").splitlines():
        if line.startswith(secret + " "):
            with contextlib.suppress(ValueError):
                return json.loads(line[len(secret) + 1:])
    return None


def _options_only(args, repo):
    """pytest's arguments without its test paths (an isolated child names its own test)."""
    return [arg for arg in args
            if arg.startswith("-") or not os.path.exists(os.path.join(repo, arg.split("::")[0]))]


def _not_dumpable():
    """Nothing in the sandbox without CAP_SYS_PTRACE may read this process's memory (the
    nonce), even as the same user."""
    with contextlib.suppress(Exception):
        import ctypes
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0


def _read_challenge(path):
    if not path:
        return {}
    try:
        with open(path) as handle:
            challenge = json.load(handle)
    except (OSError, ValueError):
        return {}
    with contextlib.suppress(OSError):
        os.unlink(path)
    return challenge if isinstance(challenge, dict) else {}


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


def _options(argv):
    end_others = challenge = None
    while argv and argv[0] in ("--end-others", "--challenge"):
        if argv[0] == "--end-others":
            end_others, argv = True, argv[1:]
        else:
            challenge, argv = argv[1], argv[2:]
    return bool(end_others), challenge, argv


def launcher(argv):
    end_others, challenge_path, argv = _options(argv)
    if not argv:
        sys.stderr.write("usage: run_pytest.py [--end-others] [--challenge FILE] RESULTS "
                         "[pytest arguments...]\n")
        os._exit(2)
    results, args = argv[0], argv[1:]
    harbor = os.environ.pop("HARBOR_REWARD_FILES", "").split()  # read before any test runs
    _not_dumpable()
    challenge = _read_challenge(challenge_path)
    repo = os.path.realpath(os.getcwd())
    if challenge.get("tripwires") or challenge.get("twins"):
        import plant_tripwires  # beside this script, never from the repository
        plant_tripwires.plant(repo, challenge.get("tripwires") or [],
                              challenge.get("twins") or [])
    main_run = _run_child(["--child"] + args, quiet=False) or {}
    tests = main_run.get("tests") if isinstance(main_run.get("tests"), dict) else {}
    isolated = {}
    for name in challenge.get("isolate") or []:
        got = _run_child(["--one", name] + _options_only(args, repo), quiet=True,
                         timeout=ISOLATED_TIMEOUT_S)
        isolated[name] = got if isinstance(got, str) else "MISSING"
    verdict = json.dumps({"nonce": challenge.get("nonce"),
                          "exit_code": main_run.get("exit_code", 1),
                          "tests": tests, "isolated": isolated})
    _write(results, verdict)  # before test.sh ends: the host may end this process after it
    if end_others:
        with contextlib.suppress(OSError):  # everything but this process (init is spared)
            os.kill(-1, signal.SIGKILL)
        _write(results, verdict)  # whatever raced the first write, nothing is left to race this
    if len(harbor) == 2:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            _write_harbor_reward(tests, *harbor)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(main_run.get("exit_code", 1)))


def main():
    argv = sys.argv[1:]
    if argv[:1] == ["--report"]:
        report_fd, mode, rest = int(argv[1]), argv[2], argv[3:]
        if mode == "--one":
            child(report_fd, rest[1:], one=rest[0])
        else:
            child(report_fd, rest)
    else:
        launcher(argv)


if __name__ == "__main__":
    main()
