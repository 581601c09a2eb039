"""Trainers' shared-memory weight files: where they live, their names, and removal of those their
owner left behind. Below both the trainer that writes them and the server that loads them (which
accepts only files so named).

A file is named after the process that made it. A trainer killed with SIGKILL cannot remove its
file, and on /dev/shm it would hold the model's size in RAM until reboot, so every new trainer
first removes the files of processes that no longer exist.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

from skyrl_agent.atomic import process_alive

log = logging.getLogger(__name__)
PREFIX = "skyrl-agent-weights-"
TRAINER_FILE = re.compile(rf"{re.escape(PREFIX)}(\d+)-\d+\.safetensors")
"""A trainer's file name (fullmatch); group 1 is its process id."""
ADAPTERS_PREFIX = "skyrl-agent-adapters-"
ADAPTERS_DIR = re.compile(rf"{re.escape(ADAPTERS_PREFIX)}(\d+)-\w+")
"""A LoRA trainer's folder of adapter versions (fullmatch); group 1 is its process id."""
_counter = itertools.count()


def shared_memory_dir() -> Path:
    """/dev/shm when this machine has a writable one (files there are RAM, never disk), else the
    temporary directory."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return Path(tempfile.gettempdir())


def new_weights_path(directory: Path | None = None) -> Path:
    """A fresh path for this process's next weights file."""
    directory = directory or shared_memory_dir()
    return directory / f"{PREFIX}{os.getpid()}-{next(_counter)}.safetensors"


def new_adapters_dir(directory: Path | None = None) -> Path:
    """A fresh folder (mode 0700) for this process's LoRA adapter versions."""
    return Path(tempfile.mkdtemp(prefix=f"{ADAPTERS_PREFIX}{os.getpid()}-",
                                 dir=directory or shared_memory_dir()))


def remove_orphans(directory: Path | None = None) -> int:
    """Remove weight files and adapter folders whose owning process is gone; returns how
    many."""
    directory = directory or shared_memory_dir()
    removed = 0
    for folder in directory.glob(f"{ADAPTERS_PREFIX}*"):
        match = ADAPTERS_DIR.fullmatch(folder.name)
        if match is not None and folder.is_dir() and not process_alive(int(match.group(1))):
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
    for path in directory.glob(f"{PREFIX}*.safetensors"):
        match = TRAINER_FILE.fullmatch(path.name)
        if match is None or process_alive(int(match.group(1))):
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

