"""How the local backend replays a task's Dockerfile without building an image.

The host's userland (read-only /usr) stands in for the base image. COPY/ADD, WORKDIR and ENV are
replayed exactly; a RUN line runs inside the sandbox at start, except package installs: an
`apt-get install` whose packages the host already has is skipped, anything else that needs a
package manager or the network is rejected with an error naming the docker backend.
"""

from __future__ import annotations

import functools
import glob
import posixpath
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from skyrl_agent.sandboxes.base import SandboxSpec, UnsupportedEnvironment
from skyrl_agent.sandboxes.dockerfile import (
    Instruction,
    base_images,
    expand,
    parse_dockerfile,
    parse_env,
    split_flags,
)

IGNORED = {"FROM", "USER", "CMD", "ENTRYPOINT", "EXPOSE", "LABEL", "VOLUME", "HEALTHCHECK",
           "STOPSIGNAL", "SHELL", "ONBUILD", "MAINTAINER"}
_APT_HOUSEKEEPING = re.compile(
    r"^(apt-get|apt) +(-\S+ +)*(update|clean|autoremove)\b|^rm +-rf +/var/lib/apt")
_APT_INSTALL = re.compile(
    r"^(?:DEBIAN_FRONTEND=\S+ +)?(?:apt-get|apt) +(?:-\S+ +)*install +(.*)$")
_NEEDS_IMAGE_BUILD = re.compile(
    r"\b(apt-get|apt|apk|yum|dnf|pip3?|uv|conda|npm|curl|wget|git +clone)\b")


@dataclass(frozen=True)
class CopyStep:
    """A host file or folder to place at an absolute sandbox path before the sandbox starts."""

    source: Path
    destination: str
    into_directory: bool
    """True when `destination` is a folder that receives the source (or its contents)."""


@dataclass(frozen=True)
class LocalPlan:
    """What start() does, in order: make dirs, copy files, then run RUN steps inside."""

    directories: tuple[str, ...]
    copies: tuple[CopyStep, ...]
    run_steps: tuple[tuple[str, str], ...]
    """(working directory, shell command) per RUN line that must run inside the sandbox."""
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"


def _unsupported(spec: SandboxSpec, ins: Instruction, why: str) -> UnsupportedEnvironment:
    return UnsupportedEnvironment(
        f"task {spec.name}: Dockerfile line {ins.line} ({ins.keyword} {ins.args[:60]}): {why}; "
        "the local sandbox cannot do this, use --sandbox docker")


@functools.cache
def _host_has_package(name: str) -> bool:
    if shutil.which("dpkg-query") is None:
        return False
    result = subprocess.run(["dpkg-query", "-W", "-f=${Status}", name],
                            capture_output=True, text=True, check=False)
    return result.stdout.strip().endswith("install ok installed")


def _run_step(spec: SandboxSpec, ins: Instruction) -> str | None:
    """The command to run for a RUN line, None to skip it; raises when it needs an image build."""
    _, words = split_flags(ins.args) if ins.args.startswith("[") else ([], [])
    command = " ".join(words) if words else ins.args
    parts = [p.strip() for p in re.split(r"&&|;", command) if p.strip()]
    leftover = []
    for part in parts:
        install = _APT_INSTALL.match(part)
        if install:
            packages = [p.split("=")[0] for p in shlex.split(install.group(1))
                        if not p.startswith("-")]
            missing = [p for p in packages if not _host_has_package(p)]
            if missing:
                raise _unsupported(spec, ins, f"packages not on this host: {' '.join(missing)}")
        elif _APT_HOUSEKEEPING.match(part):
            continue
        elif _NEEDS_IMAGE_BUILD.search(part):
            raise _unsupported(spec, ins, "it installs software or uses the network")
        else:
            leftover.append(part)
    return command if leftover else None


def _copy_steps(spec: SandboxSpec, ins: Instruction, workdir: str,
                env: dict[str, str]) -> list[CopyStep]:
    flags, words = split_flags(ins.args)
    if any(f.startswith("--from") for f in flags):
        raise _unsupported(spec, ins, "copies from another build stage")
    if len(words) < 2 or spec.environment_dir is None:
        raise _unsupported(spec, ins, "needs a source and a destination")
    *sources, destination = (expand(w, env) for w in words)
    if any("://" in s for s in sources):
        raise _unsupported(spec, ins, "downloads a URL")
    destination = posixpath.join(workdir, destination)
    root = spec.environment_dir.resolve()
    matched: list[Path] = []
    for source in sources:
        hits = sorted(glob.glob(str(root / source))) or [str(root / source)]
        for hit in hits:
            path = Path(hit).resolve()
            if not path.is_relative_to(root) or not path.exists():
                raise _unsupported(spec, ins, f"source {source!r} is not in environment/")
            matched.append(path)
    into_dir = destination.endswith("/") or len(matched) > 1 or matched[0].is_dir()
    return [CopyStep(p, posixpath.normpath(destination), into_dir) for p in matched]


def plan_local(spec: SandboxSpec) -> LocalPlan:
    """The replay plan for a spec; raises UnsupportedEnvironment for what only docker can do."""
    if spec.dockerfile is None:
        if spec.docker_image:
            raise UnsupportedEnvironment(
                f"task {spec.name} names a prebuilt image ({spec.docker_image}); "
                "the local sandbox cannot run images, use --sandbox docker")
        return LocalPlan((spec.workdir,), (), (), dict(spec.env), spec.workdir)
    instructions = parse_dockerfile(spec.dockerfile_text())
    if len(base_images(instructions)) > 1:
        raise UnsupportedEnvironment(
            f"task {spec.name}: multi-stage Dockerfiles need an image build; use --sandbox docker")
    workdir = "/"
    env: dict[str, str] = {}
    dirs: list[str] = []
    copies: list[CopyStep] = []
    runs: list[tuple[str, str]] = []
    build_args: dict[str, str] = {}
    for ins in instructions:
        if ins.keyword == "WORKDIR":
            workdir = posixpath.normpath(posixpath.join(workdir, expand(ins.args, env)))
            dirs.append(workdir)
        elif ins.keyword == "ENV":
            env.update({k: expand(v, {**build_args, **env})
                        for k, v in parse_env(ins.args).items()})
        elif ins.keyword == "ARG":
            name, _, default = ins.args.partition("=")
            build_args[name.strip()] = default.strip().strip('"')
        elif ins.keyword in ("COPY", "ADD"):
            copies.extend(_copy_steps(spec, ins, workdir, {**build_args, **env}))
        elif ins.keyword == "RUN":
            command = _run_step(spec, ins)
            if command:
                runs.append((workdir, command))
        elif ins.keyword not in IGNORED:
            raise _unsupported(spec, ins, "unknown instruction")
    env.update(spec.env)
    final_workdir = spec.workdir if spec.workdir != "/" else workdir
    return LocalPlan((*dirs, final_workdir), tuple(copies), tuple(runs), env, final_workdir)
