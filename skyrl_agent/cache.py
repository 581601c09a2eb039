"""The project's cache folder (converted models, generated tasks): one place decides where."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$SKYRL_AGENT_CACHE, else $XDG_CACHE_HOME/skyrl-agent, else ~/.cache/skyrl-agent."""
    if explicit := os.environ.get("SKYRL_AGENT_CACHE"):
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "skyrl-agent"
