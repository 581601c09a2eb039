"""Harbor agents that run inside the sandbox, given their programs without a network.

Harbor's installed agents (mini-swe-agent, the OpenHands SDK) install themselves into the
sandbox over the network before each run. Our sandboxes have none, and this environment already
holds both packages, so a relayed job skips the install (`skip_install`) and binds this
environment into the sandbox read-only (Harbor's own environment `mounts`), where each agent
looks for its program:

- mini-swe-agent: `$HOME/.local/bin/mini-swe-agent` (a folder of one link to our entry point),
- openhands-sdk: `/opt/openhands-sdk-venv/bin/python` (our environment, bound there).

Both need this interpreter's installation too (a virtual environment links to it by path),
bound at its own path. Nothing bound is writable from the sandbox (sandboxes/local.py stages a
source its unprivileged user cannot reach itself); the agents stay unmodified.
"""

from __future__ import annotations

import importlib.util
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


def _interpreter() -> list[ServiceVolumeConfig]:
    return [_bind(sys.base_prefix, sys.base_prefix)]


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
            mounts=[*_interpreter(), _bind(sys.prefix, sys.prefix),
                    _bind(links, f"{SANDBOX_HOME}/.local/bin")],
            agent_kwargs={"skip_install": True}, agent_env=dict(OFFLINE_ENV))
    if agent == "openhands-sdk":
        if importlib.util.find_spec("openhands.sdk") is None:
            raise FileNotFoundError("openhands-sdk is not installed here: scripts/setup.sh "
                                    "--dev installs it")
        return Toolchain(mounts=[*_interpreter(), _bind(sys.prefix, OPENHANDS_VENV)],
                         agent_kwargs={"skip_install": True}, agent_env=dict(OFFLINE_ENV))
    return Toolchain()
