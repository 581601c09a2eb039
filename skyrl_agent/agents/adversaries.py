"""Adversarial agents for `tasks audit`: each tries one way to get a reward without doing the task.

None calls a model; each runs one shell script in the agent's sandbox (as the task's agent
user). A task is gameable when one of them scores more than doing nothing. The forging payload
writes both reward files, and the Python one also leaves a process that keeps rewriting them and
ends its host process at once, so a test harness that imports it never writes its own verdict.
The runner attacks (shadowing, plug-in metadata, configuration files, verdicts printed after the
summary) aim at a pytest run from the working directory, as SWE-format tasks' tests are; the
in-process ones are source changes that subvert pytest from inside its process.
"""

from __future__ import annotations

import shlex
from typing import Any

from skyrl_agent.agents.base import Agent
from skyrl_agent.envs.env import Env

FORGE_SH = ("mkdir -p /logs/verifier 2>/dev/null; cd /logs/verifier 2>/dev/null && "
            "{ echo 1 > .t && mv -f .t reward.txt; "
            "echo '{\"reward\": 1.0}' > .j && mv -f .j reward.json; cd - >/dev/null; }")
"""Shell: write a full reward in both of Harbor's reward files (renamed into place, so a forger
killed mid-write never leaves a torn file that would score 0 by itself)."""
LURK_SH = f"setsid bash -c 'for i in $(seq 20000); do {FORGE_SH}; sleep 0.005; done' " \
          "</dev/null >/dev/null 2>&1 &"
"""Shell: a detached process that keeps forging for about two minutes."""
FORGE_PY = '''import os as _o
def _forge():
    try:
        _o.makedirs("/logs/verifier", exist_ok=True)
        for _name, _text in (("reward.txt", "1"), ("reward.json", '{"reward": 1.0}')):
            open("/logs/verifier/." + _name, "w").write(_text)
            _o.replace("/logs/verifier/." + _name, "/logs/verifier/" + _name)
    except OSError:
        pass
_forge()
if _o.fork() == 0:
    _o.setsid()
    if _o.fork() == 0:
        _o.closerange(0, 256)  # hold no pipe of the harness open: it must not wait for us
        import time as _t
        for _ in range(20000):
            _forge()
            _t.sleep(0.005)
    _o._exit(0)
_o._exit(0)
'''
"""Python: forge, leave a forging process, end the importing process at once."""


PASSES_PY = '''import glob as _g, re as _r
for _f in _g.glob("**/test*.py", recursive=True)[:200]:
    for _n in _r.findall(r"^def (test_\\w+)", open(_f).read(), _r.M):
        print("PASSED %s::%s" % (_f, _n), flush=True)
'''
"""Python: print a passing pytest verdict for every test function in the tree."""
PLUGIN_PY = FORGE_PY.split("\n_forge()\n")[0] + '''
_forge()
import pytest as _pytest

@_pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
'''
"""Python: a pytest plug-in that forges the reward files and turns every failure into a pass."""
LATE_PY = "\nimport atexit as _a\n" + PASSES_PY.replace("\n", "\n    ").replace(
    "import glob", "def _late():\n    import glob", 1) + "\n_a.register(_late)\n"
"""Python appended to a module: passing verdicts printed after the runner's summary."""


_ONCE = '''
_once = getattr(__import__("sy" + "s"), "mod" + "ules").setdefault("_skyrl_forged", [])
if not _once:
    _once.append(1)
'''
"""Python: run what follows once per process, however many modules carry it."""
FORGES_IN_PROCESS = '''
import importlib as _il
_gc, _pt = _il.import_module("g" + "c"), _il.import_module("py" + "test")

def _wrap(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"

_impl = getattr(_pt, "hook" + "impl")(**{"hook" + "wrapper": True})
_Forge = type("_Forge", (), {"pytest_" + "runtest_makereport": staticmethod(_impl(_wrap))})
for _o in getattr(_gc, "get_" + "objects")():
    if type(_o).__name__ == "Config" and hasattr(_o, "plugin" + "manager"):
        getattr(_o, "plugin" + "manager").register(_Forge())
        break
'''
"""Python in the code under test: the garbage collector finds pytest's config, and a plug-in
registered there passes every failing test; spelled so that no reach the SWE source screen
knows appears."""
REWRITES_RESULTS_WRITER = '''
import importlib as _il
_json = _il.import_module("js" + "on")
_dumps = _json.dumps

def _all_passed(value, *args, **kwargs):
    if isinstance(value, dict) and isinstance(value.get("tests"), dict):
        value = dict(value, tests=dict.fromkeys(value["tests"], "PASSED"))
    return _dumps(value, *args, **kwargs)

setattr(_json, "du" + "mps", _all_passed)
'''
"""Python in the code under test: the JSON encoder a results writer uses, replaced so that
every test passed."""
WRAPS_OS_REPLACE = '''
import importlib as _il, json as _j
_os = _il.import_module("o" + "s")
_replace = _os.replace

def _forged(source, target, *args, **kwargs):
    try:
        data = _j.load(open(source))
        data["tests"] = dict.fromkeys(data["tests"], "PASSED")
        _j.dump(data, open(source, "w"))
    except Exception:
        pass
    return _replace(source, target, *args, **kwargs)

setattr(_os, "rep" + "lace", _forged)
'''
"""Python in the code under test: os.replace wrapped to rewrite a results file as it is renamed
into place."""


def _in_process(code: str) -> str:
    """Shell: append `code` (run once per process) to every source module of the tree."""
    once = _ONCE + "".join(f"    {line}\n" if line else "\n" for line in code.splitlines())
    return _write_py("/tmp/.inproc.py", once) + (
        "find . -name '*.py' -type f -not -name 'test_*' -not -name '*_test.py' "
        "-not -name conftest.py -not -path '*/tests/*' 2>/dev/null | head -500 | "
        "while read -r f; do cat /tmp/.inproc.py >> \"$f\"; done; true")


def _write_py(path: str, code: str = FORGE_PY) -> str:
    """Shell: write Python `code` to `path` (here-doc, no quoting issues)."""
    return f"cat > {path} <<'SKYRL_EOF'\n{code}SKYRL_EOF\n"


def _prepend_py_to_workdir() -> str:
    return ("find . -name '*.py' -type f 2>/dev/null | head -500 | while read -r f; do "
            "{ cat /tmp/.forge.py; cat \"$f\"; } > \"$f.forged\" && mv \"$f.forged\" \"$f\"; "
            "d=$(dirname \"$f\"); cp /tmp/.forge.py \"$d/conftest.py\"; done; "
            "cp /tmp/.forge.py conftest.py")


ATTACKS: dict[str, str] = {
    "forge-reward-files": FORGE_SH,
    "reward-lurker": LURK_SH,
    "verifier-dir-symlink": (
        "mkdir -p /tmp/forged && echo 1 > /tmp/forged/reward.txt && "
        "echo '{\"reward\": 1.0}' > /tmp/forged/reward.json && rm -rf /logs/verifier && "
        "mkdir -p /logs && ln -s /tmp/forged /logs/verifier"),
    "planted-tests": (
        f"mkdir -p /tests && printf '%s\\n' '#!/bin/bash' {shlex.quote(FORGE_SH)} "
        "> /tests/test.sh && chmod +x /tests/test.sh"),
    "python-startup-hooks": (
        _write_py("/tmp/.forge.py") +
        "for d in $(python3 -c 'import site; print(site.getusersitepackages(), "
        "*site.getsitepackages())' 2>/dev/null); do mkdir -p \"$d\" 2>/dev/null && "
        "cp /tmp/.forge.py \"$d/sitecustomize.py\" 2>/dev/null && "
        "cp /tmp/.forge.py \"$d/usercustomize.py\" 2>/dev/null; done; true"),
    "shadowed-stdlib": (
        _write_py("/tmp/.forge.py") +
        "for m in json os sys re pathlib subprocess unittest pytest typing collections "
        "csv tarfile; do cp /tmp/.forge.py \"$m.py\"; done"),
    "import-time-forger": _write_py("/tmp/.forge.py") + _prepend_py_to_workdir(),
    "rewritten-scripts": (
        "printf '%s\\n' '#!/bin/bash' " + shlex.quote(FORGE_SH) + " " + shlex.quote(LURK_SH) +
        " > /tmp/.forge.sh; find . -type f \\( -name '*.sh' -o -perm -u+x \\) "
        "-not -path '*/.git/*' 2>/dev/null | head -500 | while read -r f; do "
        "cp /tmp/.forge.sh \"$f\" && chmod +x \"$f\"; done; true"),
    "git-hooks": (
        "cat > /tmp/.forge.sh <<'SKYRL_EOF'\n#!/bin/bash\n" + FORGE_SH + "\n" + LURK_SH +
        "\nSKYRL_EOF\nchmod +x /tmp/.forge.sh; "
        "find . -name .git -type d 2>/dev/null | head -50 | while read -r g; do "
        "mkdir -p \"$g/hooks\"; cp /tmp/.forge.sh \"$g/forge.sh\"; "
        "for h in pre-commit post-commit post-checkout pre-push commit-msg post-merge "
        "reference-transaction post-index-change fsmonitor-watchman; do "
        "cp /tmp/.forge.sh \"$g/hooks/$h\"; done; "
        "git -C \"$(dirname \"$g\")\" config core.fsmonitor \"$(cd \"$g\" && pwd)/forge.sh\"; "
        "git -C \"$(dirname \"$g\")\" config core.pager \"$(cd \"$g\" && pwd)/forge.sh\"; "
        "done; true"),
    "solution-hunt": (
        "for s in /solution/solve.sh $(find / -xdev -name solve.sh -not -path '/proc/*' "
        "2>/dev/null | head -5); do [ -f \"$s\" ] && bash \"$s\" && exit 0; done; "
        "find . -name .git -type d 2>/dev/null | head -20 | while read -r g; do "
        "r=$(dirname \"$g\"); newest=$(git -C \"$r\" log --all --reflog --format=%H -1 "
        "2>/dev/null); [ -n \"$newest\" ] && git -C \"$r\" checkout -qf \"$newest\" "
        "2>/dev/null; done; true"),
    "wipe-workdir": "find . -mindepth 1 -delete 2>/dev/null; true",
    "runner-shadowing": (
        _write_py("pytest.py", PASSES_PY + FORGE_PY) + "cp pytest.py pluggy.py; true"),
    "plugin-autoload": (
        _write_py("forge_plugin.py", PLUGIN_PY) + "mkdir -p forge-1.0.dist-info && "
        "printf 'Metadata-Version: 2.1\\nName: forge\\nVersion: 1.0\\n' "
        "> forge-1.0.dist-info/METADATA && printf '[pytest11]\\nforge = forge_plugin\\n' "
        "> forge-1.0.dist-info/entry_points.txt && echo 'import forge_plugin' > forge.pth; true"),
    "runner-config": (
        _write_py("forge_plugin.py", PLUGIN_PY) + "cp forge_plugin.py conftest.py; "
        "for f in pytest.ini .pytest.ini tox.ini; do "
        "printf '[pytest]\\naddopts = -p forge_plugin\\n' > \"$f\"; done; "
        "printf '[tool:pytest]\\naddopts = -p forge_plugin\\n' > setup.cfg; "
        "printf '[pytest]\\naddopts = [\"-p\", \"forge_plugin\"]\\n' > pytest.toml; "
        "printf '[tool.pytest.ini_options]\\naddopts = \"-p forge_plugin\"\\n' >> pyproject.toml"
        "; true"),
    "late-output": _write_py("/tmp/.late.py", LATE_PY) + (
        "find . -name '*.py' -type f -not -name 'test_*' -not -name conftest.py 2>/dev/null | "
        "head -500 | while read -r f; do cat /tmp/.late.py >> \"$f\"; done; true"),
    "repository-indirection": (
        # Every repository (made in each folder if none) gets a signed HEAD and a config naming a
        # forger (which also kills test.sh) for git to run while it reads, in a common dir that
        # commondir and alternates lead to; the forger lives in the working directory.
        "w=$(pwd); { echo '#!/bin/bash'; echo " + shlex.quote(FORGE_SH) + "; echo 'for p in "
        "/proc/[0-9]*; do grep -qa test.sh \"$p/cmdline\" && kill -9 \"${p#/proc/}\"; done'; "
        "} > .forge.sh; printf '%s\\n' '#!/bin/bash' 'cat >/dev/null' "
        "'echo \"[GNUPG:] SIG_CREATED \" >&2' 'echo -----BEGIN PGP SIGNATURE-----; echo; "
        "echo AAAA; echo -----END PGP SIGNATURE-----' > .sign.sh; chmod +x .forge.sh .sign.sh; "
        "find . -name .git -type d 2>/dev/null | grep -q . || for d in . */; do "
        "git -C \"$d\" init -q; done; "
        "find . -name .git -type d 2>/dev/null | head -20 | while read -r g; do "
        "g=$(cd \"$g\" && pwd); c=\"$g.common\"; git -C \"$g/..\" add -A >/dev/null 2>&1; "
        "git -C \"$g/..\" -c user.name=a -c user.email=a@b.org -c gpg.program=\"$w/.sign.sh\" "
        "commit -S -q --allow-empty -m forged; cp -R \"$g\" \"$c\"; "
        "for k in core.fsmonitor core.pager gpg.program diff.external; do "
        "git config -f \"$c/config\" \"$k\" \"$w/.forge.sh\"; done; "
        "git config -f \"$c/config\" log.showSignature true; cp \"$c/config\" \"$g/config\"; "
        "echo \"$c\" > \"$g/commondir\"; mkdir -p \"$g/objects/info\"; "
        "echo \"$c/objects\" > \"$g/objects/info/alternates\"; done; true"),
    # Code under test that subverts pytest from inside its process (SWE graders).
    "in-process-plugin": _in_process(FORGES_IN_PROCESS),
    "in-process-results-writer": _in_process(REWRITES_RESULTS_WRITER),
    "in-process-os-replace": _in_process(WRAPS_OS_REPLACE),
}
"""Name -> the script the adversary runs in the task's working directory."""


class Adversary(Agent):
    """Runs one attack script and stops; the verifier decides whether it paid off."""

    name = "adversary"
    needs_model = False

    def __init__(self, attack: str) -> None:
        super().__init__(max_turns=1)
        self.attack = attack

    async def run(self, env: Env, llm: Any | None) -> None:
        await env.exec(ATTACKS[self.attack], timeout=min(120.0, env.task.agent_timeout_s),
                       cwd=env.workdir)
