"""The verifier's judge (test.sh execs it, so it is test.sh's process).

The agent's code must run to be tested, and code that runs can lie: forge the reward file, end
the harness before it writes its verdict, leave a process that rewrites the verdict later. So
it never runs here. probe.py imports it in a child that is another user (no write access to
/logs/verifier, no signal reaches this process) in a PID namespace of its own (when the child
ends the kernel kills everything it started, at once). This process compares the child's
printed answers with the reference solution's (reference.py) and writes the reward.
"""

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, "/tests")
import cases  # noqa: E402
import probe  # noqa: E402
import reference  # noqa: E402

ISOLATIONS = (
    ["unshare", "--user", "--pid", "--fork", "--kill-child"],  # unmapped user, own PID ns
    ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"],  # nobody (root with caps)
)
VERIFIER_DIR = "/logs/verifier"
OUTPUT_LIMIT = 1 << 20


def isolation():
    """The first way to drop privileges that works in this sandbox, or None."""
    for prefix in ISOLATIONS:
        if shutil.which(prefix[0]) is None:
            continue
        if subprocess.run([*prefix, "true"], capture_output=True, timeout=10).returncode == 0:
            return prefix
    return None


def ask(prefix):
    """The child's answers (empty when it printed nothing readable)."""
    with tempfile.TemporaryFile() as out:
        try:
            subprocess.run([*prefix, sys.executable, "/tests/probe.py"], stdout=out,
                           stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, cwd="/tmp",
                           timeout=cases.TIMEOUT_S,
                           env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"})
        except subprocess.TimeoutExpired:
            return {}
        out.seek(0)
        lines = out.read(OUTPUT_LIMIT).decode(errors="replace").strip().splitlines()
    try:
        answers = json.loads(lines[-1]) if lines else {}
    except ValueError:
        return {}
    return answers if isinstance(answers, dict) else {}


def same(got, want):
    if isinstance(want, float) or isinstance(got, float):
        return (isinstance(got, (int, float)) and not isinstance(got, bool)
                and math.isclose(got, want, rel_tol=1e-7, abs_tol=1e-9))
    if isinstance(want, list):
        return (isinstance(got, list) and len(got) == len(want)
                and all(same(g, w) for g, w in zip(got, want)))
    return type(got) is type(want) and got == want


def correct(got, want):
    return (isinstance(got, dict) and set(got) == set(want)
            and all(same(got[key], want[key]) for key in want))


def write_reward(result):
    if os.path.islink(VERIFIER_DIR):
        os.unlink(VERIFIER_DIR)
    os.makedirs(VERIFIER_DIR, exist_ok=True)
    for name in ("reward.txt", "reward.json"):
        path = os.path.join(VERIFIER_DIR, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.unlink(path)
    with open(os.path.join(VERIFIER_DIR, "reward.json"), "w") as handle:
        json.dump(result, handle)


def main():
    result = {"reward": 0.0, "tests_passed": 0.0, "import_ok": 0.0, "isolated": 0.0}
    prefix = isolation()
    if prefix is None:
        print("cannot run the agent's code as another user here: reward 0")
    else:
        result["isolated"] = 1.0
        answers = ask(prefix)
        result["import_ok"] = float(bool(answers) and "import_error" not in answers)
        expected = {name: probe.answer(reference, function, args)
                    for name, function, args in cases.CASES}
        passed = sum(correct(answers.get(name), want) for name, want in expected.items())
        result["tests_passed"] = round(passed / len(expected), 4)
        result["reward"] = 1.0 if passed == len(expected) else 0.0
    print(result)
    write_reward(result)


main()
