"""Harbor agents that run inside the sandbox, given their programs without a network.

Harbor's installed agents (mini-swe-agent, the OpenHands SDK) install themselves into the
sandbox over the network before each run. Our sandboxes have none, and this environment already
holds both packages, so a relayed job skips the install (`skip_install`) and binds this
environment into the sandbox read-only (Harbor's own environment `mounts`), where each agent
looks for its program:

- mini-swe-agent: `$HOME/.local/bin/mini-swe-agent` (a folder of one link to our entry point),
- openhands-sdk: `/opt/openhands-sdk-venv/bin/python` (our environment, bound there).

Both need this interpreter's installation too (a virtual environment links to it by path),
mirrored where the unprivileged sandbox user can read it and bound at its own path. Nothing
bound is writable from the sandbox; the agents stay unmodified.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harbor.models.trial.config import ServiceVolumeConfig

SANDBOX_HOME = "/root"
"""HOME inside our sandboxes (sandboxes/local.py BASE_ENV)."""
OPENHANDS_VENV = "/opt/openhands-sdk-venv"
"""Where Harbor's openhands-sdk adapter runs its Python from."""
OFFLINE_ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "MSWEA_SILENT_STARTUP": "1"}
"""litellm would fetch its price table on import; mini-swe-agent would print a banner."""


@dataclass(frozen=True)
class Toolchain:
    """What a Harbor job needs so that one installed agent runs offline in our sandbox."""

    mounts: list[ServiceVolumeConfig] = field(default_factory=list)
    """The job's environment.mounts (read-only binds)."""
    agent_kwargs: dict[str, Any] = field(default_factory=dict)
    """Merged into the agent's kwargs."""
    agent_env: dict[str, str] = field(default_factory=dict)
    """Merged into the agent's env."""


def _bind(source: str | Path, target: str) -> ServiceVolumeConfig:
    return {"type": "bind", "source": str(source), "target": target, "read_only": True}


def interpreter_mirror(scratch: Path) -> Path:
    """This interpreter's installation (its program, shared library and standard library;
    not its tests or site-packages) as hard links under `scratch`, copies where links cannot
    be made. The sandbox user may not reach the installation itself (e.g. under root's home),
    and our virtual environment's `python` links to it by path."""
    base = Path(sys.base_prefix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    mirror = scratch / "interpreter"
    if (mirror / "bin" / version).exists():
        return mirror
    skipped = {base / "lib" / version / "test", base / "lib" / version / "site-packages"}
    (mirror / "lib").mkdir(parents=True, exist_ok=True)
    for library in sorted((base / "lib").glob(f"lib{version}*")):
        _mirror_entry(library, mirror / "lib" / library.name)
    for top in (base / "bin", base / "lib" / version):
        for folder, subfolders, files in os.walk(top):
            here = Path(folder)
            subfolders[:] = [d for d in subfolders if here / d not in skipped]
            target = mirror / here.relative_to(base)
            target.mkdir(parents=True, exist_ok=True)
            for name in [*files, *(d for d in subfolders if (here / d).is_symlink())]:
                _mirror_entry(here / name, target / name)
    (mirror / "lib" / version / "site-packages").mkdir(exist_ok=True)
    return mirror


def _mirror_entry(source: Path, target: Path) -> None:
    if source.is_symlink():
        target.symlink_to(os.readlink(source))
        return
    try:
        os.link(source, target)
    except OSError:  # another file system, or links refused
        shutil.copy2(source, target)


def _interpreter(scratch: Path) -> list[ServiceVolumeConfig]:
    return [_bind(interpreter_mirror(scratch), sys.base_prefix)]


def toolchain(agent: str, scratch: Path) -> Toolchain:
    """The mounts and settings for Harbor's `agent`; host-side links go under `scratch`.
    An agent that runs on the host (terminus-2) needs none."""
    if agent == "mini-swe-agent":
        program = Path(sys.prefix) / "bin" / "mini-swe-agent"
        if not program.is_file():
            raise FileNotFoundError("mini-swe-agent is not installed here: install the "
                                    "`agents` extra of skyrl-agent")
        links = scratch / "mini-swe-agent-bin"
        links.mkdir(parents=True, exist_ok=True)
        (links / "mini-swe-agent").unlink(missing_ok=True)
        (links / "mini-swe-agent").symlink_to(program)
        return Toolchain(
            mounts=[*_interpreter(scratch), _bind(sys.prefix, sys.prefix),
                    _bind(links, f"{SANDBOX_HOME}/.local/bin")],
            agent_kwargs={"skip_install": True}, agent_env=dict(OFFLINE_ENV))
    if agent == "openhands-sdk":
        if importlib.util.find_spec("openhands.sdk") is None:
            raise FileNotFoundError("openhands-sdk is not installed here: scripts/setup.sh "
                                    "--dev installs it")
        return Toolchain(mounts=[*_interpreter(scratch), _bind(sys.prefix, OPENHANDS_VENV)],
                         agent_kwargs={"skip_install": True}, agent_env=dict(OFFLINE_ENV))
    return Toolchain()
