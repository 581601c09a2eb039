"""A small Dockerfile reader: enough to know a task's base image, WORKDIR, ENV and COPY lines.

The docker backend hands the file to the engine; the local backend replays what it can (COPY,
WORKDIR, ENV, simple RUN) and rejects the rest with an error that names the docker backend.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from dataclasses import dataclass


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction, continuation lines joined."""

    keyword: str
    """Upper-cased instruction name (FROM, RUN, COPY, ...)."""
    args: str
    """Everything after the keyword."""
    line: int
    """1-based line where the instruction starts."""


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions in order; comments and blank lines dropped, `\\` continuations joined."""
    instructions: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # comment lines inside a continuation are skipped by docker too
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        joined = " ".join(part for part in pending if part)
        pending = []
        keyword, _, args = joined.partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip(), start))
    if pending:
        joined = " ".join(pending)
        keyword, _, args = joined.partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip(), start))
    return instructions


def split_flags(args: str) -> tuple[list[str], list[str]]:
    """(`--flag=value` options, remaining words); JSON-array form (`["a", "b"]`) is accepted."""
    if args.startswith("["):
        try:
            words = [str(w) for w in json.loads(args)]
        except json.JSONDecodeError:
            words = shlex.split(args)
    else:
        words = shlex.split(args)
    flags = [w for w in words if w.startswith("--")]
    return flags, [w for w in words if not w.startswith("--")]


def base_images(instructions: list[Instruction]) -> list[str]:
    """The image of every FROM line (several for multi-stage builds)."""
    images = []
    for ins in instructions:
        if ins.keyword == "FROM":
            _, words = split_flags(ins.args)
            images.append(words[0] if words else "")
    return images


def parse_env(args: str) -> dict[str, str]:
    """ENV in both forms: `ENV A=1 B="two words"` and the legacy `ENV A value with spaces`."""
    words = shlex.split(args)
    if words and "=" not in words[0]:
        return {words[0]: args.split(None, 1)[1] if len(words) > 1 else ""}
    return dict(word.split("=", 1) for word in words if "=" in word)


def final_workdir(instructions: list[Instruction], default: str = "/") -> str:
    """The WORKDIR in force at the end of the build (relative WORKDIRs resolved)."""
    current = default
    for ins in instructions:
        if ins.keyword == "WORKDIR":
            current = posixpath.normpath(posixpath.join(current, ins.args.strip().strip('"')))
    return current


_ENV_REF = re.compile(r"\$\{?(\w+)\}?")


def expand(value: str, env: dict[str, str]) -> str:
    """Substitute `$VAR` / `${VAR}` from ENV lines seen so far (as the builder does in
    COPY/WORKDIR)."""
    return _ENV_REF.sub(lambda m: env.get(m.group(1), m.group(0)), value)
