"""Outbound network for public local sandboxes that never reaches the host's loopback.

A public sandbox keeps the network namespace of its own that bubblewrap gives every sandbox;
slirp4netns (user-mode TCP/IP) joins it, adds a tap device and carries its traffic through
sockets of the host. Inside, 127.0.0.1 is the sandbox's own loopback, and --disable-host-loopback
closes slirp4netns's alias of the host's (10.0.2.2). So an agent reaches the internet and the
host's non-loopback addresses (as a docker bridge does) but never the services bound to the
host's loopback: the model server, Tinker, Ray. Sharing the host's namespace (bwrap
--share-net) would expose all of them.

Why slirp4netns, not pasta: Debian 12's pasta (2023-03) switches to `nobody` before it opens
/dev/net/tun, which fails where that node is root-only, and attached to a running sandbox it
could not open the sandbox's user namespace. slirp4netns opens the tap as its caller, then
drops every capability, moves to an empty root and filters its system calls (--enable-sandbox,
--enable-seccomp). It stops when its exit pipe closes: at stop(), or when the host process dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from pathlib import Path

from skyrl_agent.sandboxes.base import SandboxError, UnsupportedEnvironment

RESOLV_CONF = "resolv.conf"  # in the sandbox's host folder, mounted at /etc/resolv.conf
DNS_ADDRESS = "10.0.2.3"  # slirp4netns answers DNS here by asking the host's resolver
READY_TIMEOUT_S = 20.0


def require_slirp4netns() -> None:
    if shutil.which("slirp4netns") is None:
        raise UnsupportedEnvironment(
            "this task allows network access, which the local sandbox gives through slirp4netns, "
            "not installed: run scripts/setup.sh as root, or apt-get install slirp4netns")


def write_resolv_conf(folder: Path) -> None:
    """A resolv.conf naming slirp4netns's resolver (the host's may sit on its loopback)."""
    path = folder / RESOLV_CONF
    path.write_text(f"nameserver {DNS_ADDRESS}\n")
    path.chmod(0o644)  # read by bubblewrap as the unprivileged sandbox user


def sandbox_init_pid(bwrap_pid: int) -> int:
    """The host pid of the sandbox's first process: bubblewrap's only child."""
    try:
        children = Path(f"/proc/{bwrap_pid}/task/{bwrap_pid}/children").read_text().split()
    except OSError as exc:  # it exited: the sandbox died while starting
        raise SandboxError(f"bubblewrap (pid {bwrap_pid}) is gone: {exc}") from None
    if len(children) != 1:
        raise SandboxError(f"bubblewrap (pid {bwrap_pid}) has {len(children)} children, not 1")
    return int(children[0])


async def _read_signal(fd: int) -> bytes:
    """The first byte written to pipe `fd` (then closed); b"" if its writer leaves or is slow."""
    reader = asyncio.StreamReader()
    transport, _ = await asyncio.get_running_loop().connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0))
    try:
        return await asyncio.wait_for(reader.read(1), READY_TIMEOUT_S)
    except TimeoutError:
        return b""
    finally:
        transport.close()


def _why(log: str) -> str:
    """slirp4netns's complaint in one line: its last messages, without warnings or usage."""
    lines = [line.strip() for line in log.split("Usage:")[0].splitlines()
             if line.strip() and not line.startswith("WARNING")]
    return "; ".join(lines[-3:]) or "no output"


class SandboxNetwork:
    """A slirp4netns process serving one sandbox's network namespace."""

    def __init__(self, process: asyncio.subprocess.Process, exit_fd: int) -> None:
        self._process = process
        self._exit_fd: int | None = exit_fd

    @classmethod
    async def attach(cls, pid: int, folder: Path) -> SandboxNetwork:
        """Serve the network namespace of `pid`; returns once its interface and routes are up.
        slirp4netns logs to a file in `folder` (the sandbox's host folder)."""
        log_path = folder / "slirp4netns.log"
        ready_read, ready_write = os.pipe()
        exit_read, exit_write = os.pipe()  # our end stays open for as long as the network lives
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            process = await asyncio.create_subprocess_exec(
                "slirp4netns", "--configure", "--mtu=65520", "--disable-host-loopback",
                "--enable-sandbox", "--enable-seccomp", f"--ready-fd={ready_write}",
                f"--exit-fd={exit_read}", f"--userns-path=/proc/{pid}/ns/user", str(pid), "tap0",
                stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
                pass_fds=(ready_write, exit_read))
        except BaseException:
            os.close(exit_write)
            os.close(ready_read)
            raise
        finally:
            for fd in (log, ready_write, exit_read):
                os.close(fd)
        network = cls(process, exit_write)
        try:
            signal = await _read_signal(ready_read)
        except BaseException:
            await network.close()
            raise
        if signal != b"1":
            await network.close()
            raise SandboxError("slirp4netns could not set up the sandbox's network: "
                               f"{_why(log_path.read_text(errors='replace'))}")
        return network

    async def close(self) -> None:
        """End slirp4netns: it exits when its exit pipe closes; killed if it lingers."""
        if self._exit_fd is not None:
            os.close(self._exit_fd)
            self._exit_fd = None
        try:
            await asyncio.wait_for(self._process.wait(), timeout=5)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()
            await self._process.wait()
