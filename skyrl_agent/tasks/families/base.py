"""What a task family is: a generator that turns (seed, difficulty) into one Harbor task.

Everything a task holds (instruction, environment files, tests, reference solution) is derived
from a `random.Random` seeded by the family name, the difficulty and the seed, so the same seed
always gives the same bytes and different seeds give different tasks. Seeds are split once, here:
training uses `TRAIN_SEEDS`, evaluation `HELDOUT_SEEDS`, and a trainer refuses held-out tasks.

Generated tests follow the project's threat model like any Harbor task: they reach the sandbox
only at verification, expected values live in test.sh itself (never in a file an agent's link
could point at), checked paths must be regular files, and the reward is written once, at the end.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

TRAIN_SEEDS = range(0, 10_000)
"""Seeds of the training split (demonstrations, SFT, RL)."""
HELDOUT_SEEDS = range(10_000, 20_000)
"""Seeds of the held-out split: evaluation only."""
SPLITS = {"train": TRAIN_SEEDS, "heldout": HELDOUT_SEEDS}
ALL_SEEDS = range(TRAIN_SEEDS.start, HELDOUT_SEEDS.stop)
TASK_NAME = re.compile(r"^gen/(?P<family>[a-z][a-z0-9-]*?)-d(?P<difficulty>\d+)-(?P<seed>\d+)$")
"""Generated task names: `gen/FAMILY-dDIFFICULTY-SEED` (Harbor names are `org/name`)."""

DOCKERFILE_HEAD = (
    "FROM ubuntu:24.04\n"
    "RUN apt-get update && apt-get install -y --no-install-recommends python3 git tmux "
    "&& rm -rf /var/lib/apt/lists/*\n")


@dataclass(frozen=True)
class Step:
    """One turn of a multi-turn walkthrough: what to type, and what its output shows."""

    commands: tuple[str, ...]
    """Shell commands typed in this turn."""
    finding: str
    """One line: what the turn's output tells (a demonstration's next reply says it)."""
    carry: str = ""
    """What a summary keeps of this step, briefly (empty: the finding)."""


@dataclass(frozen=True)
class Blueprint:
    """What a family's builder decides for one task; `GeneratedTask` turns it into files."""

    instruction: str
    """instruction.md: what the agent is told."""
    checks: str
    """Bash lines of test.sh's checks (helpers `fail`, `is_file`, `has_sha`, `squeezed` are
    defined): each failing check calls `fail REASON`."""
    solution: tuple[str, ...]
    """Shell commands, run in /app one after another, that solve the task (solve.sh)."""
    plan: str
    """One sentence saying what the solution does (demonstrations use it as their plan)."""
    files: Mapping[str, bytes] = field(default_factory=dict)
    """Environment files by path relative to /app, copied in by the Dockerfile."""
    setup: tuple[str, ...] = ()
    """Dockerfile RUN commands after the copy, each with the working directory it runs in."""
    setup_dir: str = "/app"
    """The WORKDIR of the setup commands."""
    test_files: Mapping[str, bytes] = field(default_factory=dict)
    """More files for tests/ beside test.sh (checkers the checks run)."""
    steps: tuple[Step, ...] = ()
    """A walkthrough for long-horizon tasks, where each turn depends on what the last one
    showed (empty: `solution` is typed in one turn)."""
    pictures: Mapping[str, bytes] = field(default_factory=dict)
    """Images beside instruction.md that the instruction shows (`![text](NAME)`)."""


Builder = Callable[[random.Random, int], Blueprint]


@dataclass(frozen=True)
class Family:
    """A generator of tasks of one kind, at difficulties 1..len(levels)."""

    name: str
    """The family's name (`write-file`), used in task names and task sources."""
    description: str
    """One line: what its tasks ask."""
    levels: tuple[str, ...]
    """What each difficulty adds, from difficulty 1 up."""
    build: Builder
    category: str = "files"

    @property
    def difficulties(self) -> range:
        return range(1, len(self.levels) + 1)

    def generate(self, seed: int, difficulty: int = 1) -> GeneratedTask:
        """The task of this seed and difficulty (the same bytes every time)."""
        if difficulty not in self.difficulties:
            raise ValueError(f"family {self.name} has difficulties "
                             f"{self.difficulties.start}..{self.difficulties.stop - 1}, "
                             f"not {difficulty}")
        if seed not in ALL_SEEDS:
            raise ValueError(f"seeds run from {ALL_SEEDS.start} to {ALL_SEEDS.stop - 1}, "
                             f"not {seed}")
        rng = random.Random(f"{self.name}/{difficulty}/{seed}")
        return GeneratedTask(self, difficulty, seed, self.build(rng, difficulty))


def task_name(family: str, difficulty: int, seed: int) -> str:
    return f"gen/{family}-d{difficulty}-{seed}"


def split_of(name: str) -> str | None:
    """`train` or `heldout` for a generated task's name, None for any other task."""
    match = TASK_NAME.match(name)
    if match is None:
        return None
    seed = int(match["seed"])
    return next((split for split, seeds in SPLITS.items() if seed in seeds), None)


def _toml_string(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


@dataclass(frozen=True)
class GeneratedTask:
    """One generated task: its identity and its blueprint; `files()` is the Harbor tree."""

    family: Family
    difficulty: int
    seed: int
    blueprint: Blueprint

    @property
    def name(self) -> str:
        return task_name(self.family.name, self.difficulty, self.seed)

    def files(self) -> dict[str, bytes]:
        """Every file of the task directory, by relative path."""
        bp = self.blueprint
        tree = {"task.toml": self._task_toml().encode(),
                "instruction.md": bp.instruction.encode(),
                "environment/Dockerfile": self._dockerfile().encode(),
                "tests/test.sh": self._test_sh().encode(),
                "solution/solve.sh": self._solve_sh().encode()}
        tree.update({f"environment/files/{path}": data for path, data in bp.files.items()})
        tree.update({f"tests/{path}": data for path, data in bp.test_files.items()})
        tree.update(bp.pictures)
        return tree

    def digest(self) -> str:
        """A hash of every path and byte of the task (two tasks with one digest are equal)."""
        h = hashlib.sha256()
        for path, data in sorted(self.files().items()):
            h.update(f"{path}\0{len(data)}\0".encode())
            h.update(data)
        return h.hexdigest()

    def _task_toml(self) -> str:
        return "\n".join([
            'schema_version = "1.4"', "",
            "[task]", f"name = {_toml_string(self.name)}",
            f"description = {_toml_string(self.family.description)}", "",
            "[metadata]", f"category = {_toml_string(self.family.category)}",
            f"family = {_toml_string(self.family.name)}",
            f"difficulty = {self.difficulty}", f"seed = {self.seed}",
            f"split = {_toml_string(split_of(self.name) or '')}",
            f"plan = {_toml_string(self.blueprint.plan)}",
            *self._walkthrough_toml(),
            'tags = ["generated"]', "",
            "[agent]", "timeout_sec = 120", "",
            "[verifier]", "timeout_sec = 60", "",
            "[environment]", "cpus = 1", "memory_mb = 512", 'network_mode = "no-network"', ""])

    def _walkthrough_toml(self) -> list[str]:
        """`walkthrough = [{commands = [...], finding = "...", carry = "..."}, ...]` when the
        blueprint has
        steps (what `tasks.solution.solution_walkthrough` reads back)."""
        if not self.blueprint.steps:
            return []
        steps = ", ".join(
            "{commands = [" + ", ".join(_toml_string(c) for c in step.commands) + "], "
            f"finding = {_toml_string(step.finding)}, carry = {_toml_string(step.carry)}}}"
            for step in self.blueprint.steps)
        return [f"walkthrough = [{steps}]"]

    def _dockerfile(self) -> str:
        bp = self.blueprint
        lines = [DOCKERFILE_HEAD.rstrip("\n"), "WORKDIR /app"]
        if bp.files:
            lines.append("COPY files/ /app/")
        if bp.setup:
            lines.append(f"WORKDIR {bp.setup_dir}")
            lines += [f"RUN {command}" for command in bp.setup]
            lines.append("WORKDIR /app")
        return "\n".join(lines) + "\n"

    def _solve_sh(self) -> str:
        # Harbor runs solve.sh in the task's working directory, /app.
        return "\n".join(["#!/bin/bash", "set -euo pipefail", *self.blueprint.solution]) + "\n"

    def _test_sh(self) -> str:
        checks = "\n".join(f"    {line}" if line else "" for line in
                           self.blueprint.checks.strip("\n").splitlines())
        return TEST_SH.format(name=self.name, family=self.family.name,
                              difficulty=self.difficulty, seed=self.seed, checks=checks)


TEST_SH = """#!/bin/bash
# Generated by skyrl-agent: {name} (family {family}, difficulty {difficulty}, seed {seed}).
# Bash reads main() whole before it runs, and the reward is written once, at the end: nothing a
# checked file does while the checks run can change what they do or what they conclude.

main() {{
    mkdir -p /logs/verifier
    rm -f /logs/verifier/reward.json
    echo 0 > /logs/verifier/reward.txt
    ok=1
{checks}
    [ "$ok" = 1 ] && echo "all checks passed"
    rm -f /logs/verifier/reward.json
    echo "$ok" > /logs/verifier/reward.txt
}}

# fail REASON: one check failed.
fail() {{ echo "FAIL: $*"; ok=0; }}
# is_file PATH: a regular file, not a link (a link is never followed into the verifier's files).
is_file() {{ [ -f "$1" ] && [ ! -L "$1" ]; }}
# has_sha PATH SHA256: a regular file holding exactly the bytes with this hash.
has_sha() {{ is_file "$1" && [ "$(sha256sum < "$1" | cut -d' ' -f1)" = "$2" ]; }}
# squeezed PATH: the first 4 KiB of a file, all whitespace removed.
squeezed() {{ head -c 4096 -- "$1" | tr -d ' \\t\\r\\n'; }}

main "$@"; exit 0
"""


def sha256(data: str | bytes) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def check_file(path: str, content: str | bytes, what: str = "") -> str:
    """A check line: `path` is a regular file holding exactly `content`."""
    return f'has_sha {path} {sha256(content)} || fail "{what or path} is missing or wrong"'


def check_answer(path: str, answer: str) -> str:
    """A check line: `path` holds `answer`, whitespace aside (answers never hold spaces)."""
    return (f'is_file {path} && [ "$(squeezed {path})" = "{answer}" ] '
            f'|| fail "{path} does not hold the expected answer"')
