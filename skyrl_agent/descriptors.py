"""The host process's file descriptors: enough of them, some always kept for its own work, and
a few held back so that clean-up still runs when every other one is gone.

Everything a sandbox can make the host hold open (connections to a loopback route, its
pipes, its disk) costs descriptors of one shared process. Linux starts a process at a soft
limit of 1024 whatever its hard limit, so at start the host raises the soft limit to the hard
one (`prepare`). Sandbox-facing services accept only while more than HEADROOM descriptors are
left (`descriptors_left`), so starting and stopping sandboxes, talking to the engine and the
model servers never find none. Should the process run out anyway (a bug, or a library that
leaks), clean-up gives back the RESERVE it has held since start and tries once more
(`with_reserve`), so a sandbox's stop() still removes what it made.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import threading
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)
HEADROOM = 256
"""Descriptors kept for the host's own work: sandbox-facing services stop accepting below."""
RESERVE = 32
"""Descriptors held from start and given back only to clean-up that found none (a stop needs
a handful: cgroup files, the umount child's pipes, one per folder level being removed)."""
_OUT = (errno.EMFILE, errno.ENFILE)
_lock = threading.Lock()
_reserve: list[int] = []
_prepared = False
_counted = (-1e9, 0)
"""When descriptors_left last counted, and what it found."""


def raise_open_file_limit() -> int:
    """Raise this process's soft open-file limit to its hard limit (children inherit it);
    returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:  # setrlimit refuses infinity: the kernel's own cap
        try:
            hard = int(Path("/proc/sys/fs/nr_open").read_text())
        except (OSError, ValueError):
            hard = 1 << 20
    if soft != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (OSError, ValueError) as exc:  # e.g. a container that forbids it
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, hard, exc)
    return soft


def prepare() -> None:
    """Once per process, at its start (CLI entry, a run, a sandbox's start): raise the
    open-file limit and take the reserve. Cheap after the first call."""
    global _prepared
    if _prepared:
        return
    _prepared = True
    limit = raise_open_file_limit()
    fill_reserve()
    log.debug("open-file limit %d, %d held in reserve", limit, len(_reserve))


def open_file_limit() -> int:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return (1 << 31) if soft == resource.RLIM_INFINITY else soft


def open_descriptors() -> int:
    """Descriptors this process has open now (the limit when it cannot even look)."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less the listing's own
    except OSError:
        return open_file_limit()


def descriptors_left(max_age_s: float = 0.0) -> int:
    """How many more descriptors this process may open before it runs out. Counting costs
    ~2 ms per 1,000 open (the kernel lists them): a count up to `max_age_s` old will do, less
    what `spent` was told of since."""
    global _counted
    now = time.monotonic()
    if now - _counted[0] > max_age_s:
        _counted = (now, open_file_limit() - open_descriptors())
    return _counted[1]


def spent(count: int = 1) -> None:
    """Count `count` descriptors just opened against descriptors_left's last count."""
    global _counted
    _counted = (_counted[0], _counted[1] - count)


def out_of_descriptors(error: BaseException | None) -> bool:
    """Whether `error`, or anything it wraps (causes, contexts, an HTTP library's `reason`
    or arguments), is this process or the system running out of file descriptors."""
    seen: set[int] = set()
    pending: list[object] = [error]
    while pending:
        item = pending.pop()
        if not isinstance(item, BaseException) or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, OSError) and item.errno in _OUT:
            return True
        pending += [item.__cause__, item.__context__, getattr(item, "reason", None), *item.args]
    return False


def fill_reserve() -> None:
    """Hold RESERVE descriptors (of /dev/null), as many as can be opened now."""
    with _lock:
        while len(_reserve) < RESERVE:
            try:
                _reserve.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
            except OSError:
                return


def release_reserve() -> int:
    """Close the reserve so clean-up can open what it needs; returns how many it freed."""
    with _lock:
        freed = len(_reserve)
        while _reserve:
            os.close(_reserve.pop())
    return freed


def with_reserve[T](step: Callable[[], T]) -> T:
    """`step()`; when it fails for want of descriptors, the reserve is given back and it runs
    once more (then the reserve is taken again, as far as descriptors allow)."""
    try:
        return step()
    except Exception as exc:
        if not out_of_descriptors(exc):
            raise
        freed = release_reserve()
        log.warning(
            "out of file descriptors (%d open of %d) in clean-up; %d from the reserve",
            open_descriptors(),
            open_file_limit(),
            freed,
        )
        try:
            return step()
        finally:
            fill_reserve()


async def clean_up(what: str, step: Callable[[], object]) -> bool:
    """A clean-up step of a sandbox's stop(), in a thread, with the reserve when descriptors
    ran out. False when it failed or said so (returned False): a failure is logged, never
    raised, so stop() goes on and what the step left is the reaper's."""
    try:
        return await asyncio.to_thread(with_reserve, step) is not False
    except Exception as exc:  # noqa: BLE001 - stop() must go on whatever failed
        log.warning("%s failed (%s: %s); left for the reaper", what, type(exc).__name__, exc)
        return False
