"""A Ray cluster of Docker containers for the multi-node tests, started with testcontainers from
the local base image: a head node and worker nodes on a private Docker network.

Every node runs this machine's Python and the project's virtual environment, mounted read-only
at the same paths (the base image is the same Debian release as this machine), and one shared
folder, read-write at the same path: what a shared file system gives a real cluster (the model,
the run dir). Nodes join with a random token (Ray's token authentication), so nothing else on
the network can. Sandboxes inside a node are bubblewrap sandboxes, which need namespaces and a
fresh /proc: a node may create namespaces (seccomp off, CAP_SYS_ADMIN), and unmounts the masks
Docker lays over its /proc before Ray starts (the kernel refuses a new /proc while they hide
parts of the old one).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")  # its helper cannot be pulled

from testcontainers.core.container import DockerContainer
from testcontainers.core.network import Network

from tests.conftest import BASE_IMAGE, REPO

VENV = Path(sys.prefix)
RAY = VENV / "bin" / "ray"


@dataclass
class Detached:
    """A command running inside a node; its output and exit status land in the shared folder."""

    log: Path

    @property
    def returncode(self) -> int | None:
        status = self.log.with_suffix(".rc")
        return int(status.read_text()) if status.exists() else None

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.returncode is None:
            assert time.monotonic() < deadline, f"still running after {timeout:.0f} s:\n" \
                                                f"{self.output()[-3000:]}"
            time.sleep(1.0)
        return self.returncode

    def output(self) -> str:
        return self.log.read_text() if self.log.exists() else ""


@dataclass
class RayCluster:
    head: DockerContainer
    workers: list[DockerContainer]

    def start(self, node: DockerContainer, command: Sequence[str], log: Path) -> Detached:
        """Run `command` in `node` without waiting for it."""
        line = f"{shlex.join(command)} > {shlex.quote(str(log))} 2>&1; " \
               f"echo $? > {shlex.quote(str(log.with_suffix('.rc')))}"
        node.get_wrapped_container().exec_run(["sh", "-c", line], detach=True)
        return Detached(log)

    def running(self, node: DockerContainer, title: str) -> int:
        """How many processes in `node` carry `title` (Ray names an actor's process after its
        class)."""
        code, out = node.exec(["pgrep", "-c", "-f", title])
        return int(out.decode().strip() or 0) if code in (0, 1) else 0

    def alive_nodes(self) -> int:
        code, out = self.head.exec([str(VENV / "bin" / "python"), "-c", (
            "import ray; ray.init(address='auto', logging_level='ERROR'); "
            "print(sum(n['Alive'] for n in ray.nodes()))")])
        return int(out.decode().strip().splitlines()[-1]) if code == 0 else 0


def _node(network: Network, shared: Path, token: str, command: list[str]) -> DockerContainer:
    base = Path(sys.base_prefix)
    node = (DockerContainer(BASE_IMAGE)
            .with_network(network)
            .with_env("RAY_AUTH_MODE", "token").with_env("RAY_AUTH_TOKEN", token)
            # A lost node is noticed in seconds, not Ray's default of about a minute.
            .with_env("RAY_health_check_period_ms", "1000")
            .with_env("RAY_health_check_timeout_ms", "1000")
            .with_env("RAY_health_check_failure_threshold", "3")
            .with_env("PATH", f"{VENV / 'bin'}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .with_volume_mapping(str(base), str(base), "ro")
            .with_volume_mapping(str(VENV), str(VENV), "ro")
            .with_volume_mapping(str(REPO), str(REPO), "ro")
            .with_volume_mapping(str(shared), str(shared), "rw")
            .with_volume_mapping("/usr/bin/bwrap", "/usr/bin/bwrap", "ro")
            .with_kwargs(shm_size="1g", cap_add=["SYS_ADMIN"],
                         security_opt=["seccomp=unconfined", "apparmor=unconfined"])
            .with_command(["sh", "-c", f"{UNMASK_PROC}; exec {shlex.join(command)}"]))
    return node


UNMASK_PROC = ("for m in $(grep ' /proc/' /proc/mounts | cut -d' ' -f2 | sort -r); "
               "do umount $m; done")


@contextlib.contextmanager
def ray_cluster(shared: Path, head_cpus: int, workers: int, worker_cpus: int = 1,
                ready_timeout: float = 180.0) -> Iterator[RayCluster]:
    """A head with `head_cpus` CPUs and `workers` worker nodes; every container removed on
    exit."""
    token = secrets.token_hex(16)
    started: list[DockerContainer] = []
    with Network() as network:
        try:
            head = _node(network, shared, token, [
                str(RAY), "start", "--head", "--port=6379", f"--num-cpus={head_cpus}",
                "--include-dashboard=false", "--disable-usage-stats", "--block",
            ]).with_network_aliases("head")
            head.start()
            started.append(head)
            nodes = []
            for _ in range(workers):
                node = _node(network, shared, token, [
                    str(RAY), "start", "--address=head:6379", f"--num-cpus={worker_cpus}",
                    "--disable-usage-stats", "--block"])
                node.start()
                started.append(node)
                nodes.append(node)
            cluster = RayCluster(head, nodes)
            deadline = time.monotonic() + ready_timeout
            while cluster.alive_nodes() < 1 + workers:
                assert time.monotonic() < deadline, head.get_logs()
                time.sleep(2.0)
            yield cluster
        finally:
            for container in started:
                with contextlib.suppress(Exception):
                    container.stop()
