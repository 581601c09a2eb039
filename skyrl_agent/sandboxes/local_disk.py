"""Disks and leftovers of local sandboxes: a sandbox's root folder is a fresh ext4 file system
on a sparse loop file of `storage_mb` (as root, where loop devices work), and a sandbox whose
owner process died (a killed run) is found by its owner file and removed."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from skyrl_agent.descriptors import out_of_descriptors
from skyrl_agent.sandboxes.base import SandboxError
from skyrl_agent.sandboxes.cgroups import Cgroup, abandoned_cgroups, cgroups_available

# A sandbox's folder is named "<sandbox id>@<pid>:<start time>" of the process that made it. A
# name cannot be half-written: a run killed while it makes or removes the folder still leaves
# its owner readable, where an owner file inside may not exist yet or be gone already.
OWNER_MARK = "@"
log = logging.getLogger(__name__)


def can_mount() -> bool:
    """Whether sandbox disks can be loop-mounted ext4 file systems here (root, tools, loop)."""
    return (os.geteuid() == 0 and shutil.which("mkfs.ext4") is not None
            and shutil.which("mount") is not None and os.path.exists("/dev/loop-control"))


def mount_disk(image: Path, mountpoint: Path, size_mb: int) -> None:
    """Make a sparse `size_mb` ext4 image and mount it (nosuid, nodev) at `mountpoint`."""
    with open(image, "wb") as handle:
        handle.truncate(size_mb * 1024 * 1024)
    # No journal and no resize inode: a throwaway disk, made in ~10 ms instead of ~40.
    mkfs = ["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal,^resize_inode"]
    for step in ([*mkfs, str(image)],
                 ["mount", "-o", "loop,nosuid,nodev", str(image), str(mountpoint)]):
        done = subprocess.run(step, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SandboxError(f"cannot make a sandbox disk ({step[0]}): "
                               f"{done.stderr.strip()[-300:]}")
    (mountpoint / "lost+found").rmdir()


def unmount(path: Path) -> None:
    for _ in range(50):
        if subprocess.run(["umount", str(path)], capture_output=True).returncode == 0:
            return
        time.sleep(0.05)  # busy while the last killed process is torn down
    subprocess.run(["umount", "-l", str(path)], capture_output=True)
    log.warning("sandbox disk %s was busy; detached it lazily", path)


def process_identity(pid: int) -> str:
    """`pid:start-time`, unique for a process's lifetime (a pid alone may be reused)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return f"{pid}:gone"
    return f"{pid}:{stat.rsplit(') ', 1)[1].split()[19]}"


def _writable_and_again(function: Callable[..., object], target: str,
                        error: BaseException) -> None:
    """rmtree's error handler. A sandbox may leave folders without write or search permission
    (a host not running as root is held by those): they are made ours and the one step that
    failed runs again. Something already gone is fine; any other error is raised."""
    if isinstance(error, FileNotFoundError):
        return
    if not isinstance(error, PermissionError):
        raise error
    os.chmod(os.path.dirname(target), 0o700)
    if function in (os.open, os.scandir):  # a folder that could not be opened or listed
        os.chmod(target, 0o700)
        shutil.rmtree(target, onexc=_writable_and_again)
    elif function in (os.unlink, os.rmdir):
        function(target)
    else:
        raise error


def remove_tree(path: Path) -> None:
    """Delete a sandbox's folder, whatever the sandbox left in it. Raises OSError when it
    cannot (out of descriptors: the caller gives back its reserve and calls again, see
    descriptors.with_reserve), never anything else."""
    failure: BaseException | None = None
    for _ in range(3):  # a copy still running in a cancelled start() may add files meanwhile
        try:
            shutil.rmtree(path, onexc=_writable_and_again)
            return
        except OSError as exc:
            if out_of_descriptors(exc):
                raise
            failure = exc
        except RecursionError as exc:  # nested deeper than Python's stack: rm has none
            failure = exc
            break
    subprocess.run(["rm", "-rf", "--", str(path)], capture_output=True, check=False)
    if os.path.lexists(path):
        raise OSError(f"cannot remove {path}: {failure}")


def sandbox_folder_name(sandbox_id: str) -> str:
    """The folder name of a sandbox this process makes: its id and this process's identity."""
    return f"{sandbox_id}{OWNER_MARK}{process_identity(os.getpid())}"


def sandboxes_folder(work_root: Path | None) -> Path:
    """Where local sandboxes keep their folders: `sandbox.work_root`, or one in the temp dir."""
    return work_root or Path(tempfile.gettempdir()) / "skyrl-agent-sandboxes"


def reap_stale_sandboxes(work_root: Path | None = None) -> int:
    """Remove local sandboxes whose owner process has exited (a killed run): their processes,
    cgroups, disks and folders, and cgroups left empty without a folder. Returns how many
    sandbox folders were removed."""
    base = sandboxes_folder(work_root)
    removed = 0
    for folder in base.glob("*") if base.is_dir() else []:
        sandbox_id, mark, owner = folder.name.rpartition(OWNER_MARK)
        pid = owner.partition(":")[0]
        if not mark or not pid.isdigit():
            continue  # not a sandbox folder
        if process_identity(int(pid)) == owner:
            continue  # its owner still runs
        if cgroups_available() and not Cgroup(sandbox_id).remove():
            continue  # still busy: the next reaping retries
        if os.path.ismount(folder / "root"):
            unmount(folder / "root")
        try:
            remove_tree(folder)
        except OSError as exc:  # the next reaping retries
            log.warning("cannot reap sandbox folder %s: %s", folder, exc)
            continue
        removed += 1
    if cgroups_available():  # cgroups whose folder went first (a crash inside stop())
        for group in abandoned_cgroups():
            group.remove()
    return removed
