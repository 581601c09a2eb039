"""Names of trainers' shared-memory weight files, and removal of those their owner left behind.

A file is named after the process that made it. A trainer killed with SIGKILL cannot remove its
file, and on /dev/shm it would hold the model's size in RAM until reboot, so every new trainer
first removes the files of processes that no longer exist.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
from pathlib import Path

from skyrl_agent.trainers.weight_sync.shared_memory import shared_memory_dir

log = logging.getLogger(__name__)
PREFIX = "skyrl-agent-weights-"
_OWNED = re.compile(rf"^{re.escape(PREFIX)}(\d+)-\d+\.safetensors$")
_counter = itertools.count()


def new_weights_path(directory: Path | None = None) -> Path:
    """A fresh path for this process's next weights file."""
    directory = directory or shared_memory_dir()
    return directory / f"{PREFIX}{os.getpid()}-{next(_counter)}.safetensors"


def remove_orphans(directory: Path | None = None) -> int:
    """Remove weight files whose owning process is gone; returns how many."""
    directory = directory or shared_memory_dir()
    removed = 0
    for path in directory.glob(f"{PREFIX}*.safetensors"):
        match = _OWNED.match(path.name)
        if match is None or _alive(int(match.group(1))):
            continue
        try:
            path.unlink()
            removed += 1
        except FileNotFoundError:
            continue
        except OSError as exc:  # another user's file: not ours to remove
            log.warning("cannot remove orphaned weights file %s: %s", path, exc)
    if removed:
        log.info("removed %d weights files left by stopped trainers", removed)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True
