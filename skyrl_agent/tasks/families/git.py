"""Commit a change with git.

The repository is made by the Dockerfile; its files and their git tree ids are known here, so
the checks compare ids only. They read the agent's `.git` through gitcheck.sh (the bundled
git-init-commit task's checker, a test file of every task here): git sees a snapshot of HEAD,
refs and objects alone, with a configuration of its own. A repository's files can lead git to
configuration and history elsewhere, configuration can name programs git runs, and the
verifier must run none of the agent's choosing; gitcheck.sh says how, and why git at all.
"""

from __future__ import annotations

import hashlib
import random

from skyrl_agent.tasks.base import bundled_root
from skyrl_agent.tasks.families.base import Blueprint, Family
from skyrl_agent.tasks.families.words import FILE_STEMS, NOUNS, PEOPLE, phrase

REPO = "/app/repo"
_INITIAL_DATE = "2024-01-01T00:00:00Z"
GITCHECK = bundled_root() / "demo" / "git-init-commit" / "tests" / "gitcheck.sh"
"""Shell functions that read a repository without running anything it names (tests/)."""


def blob_id(data: bytes) -> bytes:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).digest()


def tree_id(files: dict[str, bytes]) -> str:
    """git's id of a tree holding only these files (mode 100644) at its top."""
    body = b"".join(b"100644 " + name.encode() + b"\0" + blob_id(files[name])
                    for name in sorted(files))
    return hashlib.sha1(b"tree %d\0" % len(body) + body).hexdigest()


def _lines(rng: random.Random, count: int) -> bytes:
    return "".join(f"{phrase(rng, rng.randint(2, 3))}\n" for _ in range(count)).encode()


CHECKS = """\
. /tests/gitcheck.sh
git_snapshot {repo}/.git || fail "{repo} is not a sound git repository"
[ "$(gitc rev-list --count HEAD)" = 2 ] || fail "there must be exactly one commit after the first"
[ "$(gitc rev-parse --verify -q 'HEAD~1^{{tree}}')" = {initial} ] || fail "the first commit changed"
[ "$(gitc rev-parse --verify -q 'HEAD^{{tree}}')" = {final} ] || fail "the new commit is wrong"
[ "$(gitc log -1 --no-ext-diff --no-textconv --format=%s HEAD)" = "{message}" ] \\
    || fail "the commit message is not '{message}'"
"""


def build_commit(rng: random.Random, difficulty: int) -> Blueprint:
    stems = rng.sample(FILE_STEMS, 3)
    initial = {"README.md": f"# {rng.choice(NOUNS)}\n\n{phrase(rng, 3)}\n".encode(),
               f"{stems[0]}.txt": _lines(rng, rng.randint(1, 3)),
               f"{stems[1]}.txt": _lines(rng, rng.randint(1, 3))}
    final = dict(initial)
    line = phrase(rng, 3)
    if difficulty == 2:
        target = f"{stems[0]}.txt"
        final[target] = initial[target] + f"{line}\n".encode()
        change = f"append the line `{line}` to `{target}`"
        commands = [f"printf '{line}\\n' >> {target}", f"git add {target}"]
        verb = "Extend"
    else:
        target = f"{stems[2]}.txt"
        final[target] = f"{line}\n".encode()
        change = f"create the file `{target}` containing the line `{line}`"
        commands = [f"printf '{line}\\n' > {target}", f"git add {target}"]
        verb = "Add"
        if difficulty == 3:
            removed = f"{stems[1]}.txt"
            del final[removed]
            change += f", and delete `{removed}`"
            commands.append(f"git rm -q {removed}")
            verb = "Replace"
    message = f"{verb} {target.removesuffix('.txt')} {rng.choice(NOUNS)}"
    name, email = rng.choice(PEOPLE)
    setup = ("git init -q", f'git config user.name "{name}"', f"git config user.email {email}",
             "git add -A", f"GIT_AUTHOR_DATE={_INITIAL_DATE} GIT_COMMITTER_DATE={_INITIAL_DATE} "
             "git commit -q -m 'First commit'")
    instruction = (f"`{REPO}` is a git repository with one commit. In it, {change}; then record "
                   f"that change as exactly one new commit with the message `{message}`.\n")
    return Blueprint(
        instruction=instruction,
        checks=CHECKS.format(repo=REPO, initial=tree_id(initial), final=tree_id(final),
                             message=message),
        solution=(f"cd {REPO}", *commands, f"git commit -q -m '{message}'"),
        plan="Make the change in the repository, then commit it with git.",
        files={f"repo/{path}": data for path, data in initial.items()},
        setup=setup, setup_dir=REPO, test_files={"gitcheck.sh": GITCHECK.read_bytes()})


FAMILIES = (
    Family("git-commit", "Make a change in a git repository and commit it.",
           ("add a file", "append to a file", "add one file and delete another"),
           build_commit, category="git"),
)
