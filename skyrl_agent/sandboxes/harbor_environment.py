"""Our sandboxes as a Harbor environment: `harbor run -e skyrl_agent.harbor:SkyrlEnvironment`.

Harbor trials (any Harbor agent, Harbor's verifier) then run in a bubblewrap sandbox of ours
(no daemon, no network unless the task asks for it, cgroup limits) or, with
`--ek backend=docker`, in our docker backend. The sandbox is built from the task directory the
way our own runs build it (SandboxSpec.from_task), so the two paths isolate a task alike.
`SkyrlEnvironment.over` adopts a sandbox an episode already started (its start and stop stay
the episode's): how Harbor's own agents act in our episodes (agents/blackbox/terminus2.py).

Files coming out go through the sandbox's bundle (artifacts.py): regular files, folders and
links, links kept as links; on the host, a link that would point outside the target folder is
not written, so nothing the agent planted makes Harbor read the host's own files.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import logging
import tarfile
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.environments.options import EnvironmentOptions
from harbor.models.task.config import NetworkMode, NetworkPolicy
from harbor.models.trial.config import ServiceVolumeConfig
from harbor.models.trial.paths import EnvironmentPaths
from harbor.server.relay import PREFIX as RELAY_PREFIX

from skyrl_agent.config import SandboxConfig
from skyrl_agent.descriptors import prepare
from skyrl_agent.sandboxes.artifacts import ArtifactLimits, BundleWriter
from skyrl_agent.sandboxes.base import Sandbox, SandboxSpec, create_sandbox
from skyrl_agent.sandboxes.loopback_route import LoopbackRoute
from skyrl_agent.tasks.spec import TaskSpec, load_task

log = logging.getLogger(__name__)
TRIAL_DEADLINE_S = 4 * 3600.0
"""A trial's sandbox lifetime: Harbor enforces the agent and verifier timeouts itself."""


def extract_bundle(bundle: bytes, top: str, target: Path) -> None:
    """Unpack the contents of the bundle's folder `top` (its path from `/`) into `target`.
    Members that would land or point outside `target` are left out (tarfile's data filter,
    member by member, checked where they land)."""
    prefix = top.strip("/") + "/"
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(bundle), mode="r:gz") as archive:
        for member in archive:
            if not member.name.startswith(prefix):
                continue  # the folder itself
            member.name = member.name.removeprefix(prefix)
            try:
                safe = tarfile.data_filter(member, str(target))
            except tarfile.FilterError:
                log.warning("left out %s: it points outside %s", member.name, target)
                continue
            archive.extract(safe, target, filter="fully_trusted")


class SkyrlEnvironmentOptions(EnvironmentOptions):
    """What `--ek key=value` may set on SkyrlEnvironment (checked by Harbor's preflight)."""

    backend: Literal["local", "docker"] = "local"
    """Our sandbox backend the trial runs in."""
    work_root: str | None = None
    """Host folder for local sandboxes' private files; None = the system temp folder."""
    relay_url: str | None = None
    """`harbor serve`'s relay URL (its `--relay-url`, on this host's 127.0.0.1): served inside
    the sandbox at the same address, under the relay's path only (loopback_route.py), so a
    Harbor agent that runs in the sandbox reaches its model and nothing else of the host."""


class SkyrlEnvironment(BaseEnvironment):
    """A Harbor environment backed by a skyrl-agent sandbox (`backend`: local or docker)."""

    options_model = SkyrlEnvironmentOptions

    def __init__(self, *args: Any, backend: str = "local", work_root: str | None = None,
                 relay_url: str | None = None, **kwargs: Any) -> None:
        self.options = options = self._parse_options_model(
            SkyrlEnvironmentOptions,
            {"backend": backend, "work_root": work_root, "relay_url": relay_url})
        self._config = SandboxConfig(
            backend=options.backend,
            work_root=Path(options.work_root) if options.work_root else None)
        self._sandbox: Sandbox | None = None
        self._route: LoopbackRoute | None = None
        self._owned = True
        super().__init__(*args, **kwargs)
        self._read_only_mounts = read_only_binds(self._host_mounts)

    @classmethod
    def over(cls, sandbox: Sandbox, task: TaskSpec, trial_dir: Path) -> SkyrlEnvironment:
        """A started sandbox as a Harbor environment; starting and stopping it stay with its
        owner."""
        from harbor.models.trial.paths import TrialPaths

        name = task.name.replace("/", "__")
        environment = cls(environment_dir=task.environment_dir, environment_name=name,
                          session_id=f"{name}__env", trial_paths=TrialPaths(trial_dir=trial_dir),
                          task_env_config=task.config.environment)
        environment._sandbox, environment._owned = sandbox, False
        environment.default_user = task.config.agent.user
        return environment

    @staticmethod
    def type() -> str:
        return "skyrl-agent"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        # An allowlist is served only as the relay route: the one host Harbor allows an
        # installed agent is its relay (validate_network_policy_support says so).
        relayed = self.options.relay_url is not None
        return EnvironmentCapabilities(disable_internet=True, network_allowlist=relayed,
                                       network_allowlist_hostnames=relayed,
                                       network_allowlist_ipv4_addresses=relayed)

    def validate_network_policy_support(self, network_policy: NetworkPolicy | None = None,
                                        ) -> None:
        super().validate_network_policy_support(network_policy)
        policy = network_policy or self._network_policy
        if policy.network_mode != NetworkMode.ALLOWLIST:
            return
        relay_host = urlsplit(self.options.relay_url or "").hostname
        others = [host for host in policy.allowed_hosts if host != relay_host]
        if others:
            raise ValueError(f"a skyrl-agent sandbox reaches only Harbor's inference relay "
                             f"({self.options.relay_url}), not {', '.join(others)}")

    def _validate_definition(self) -> None:
        if not (Path(self.environment_dir) / "Dockerfile").is_file() and \
                not self.task_env_config.docker_image:
            raise FileNotFoundError(f"{self.environment_dir} has no Dockerfile")

    def _spec(self) -> SandboxSpec:
        task = load_task(Path(self.environment_dir).parent)
        config = self._config.model_copy(update={"deadline_s": TRIAL_DEADLINE_S})
        spec = SandboxSpec.from_task(task, config)
        return dataclasses.replace(spec, read_only_mounts=self._read_only_mounts)

    async def start(self, force_build: bool) -> None:
        if not self._owned:
            return
        prepare()  # `harbor run` is not our CLI: its open-file limit is raised here
        sandbox = create_sandbox(self._spec(), self._config)
        try:
            await sandbox.start()
        except BaseException:  # what it made so far goes too
            await asyncio.shield(sandbox.stop())
            raise
        self._sandbox = sandbox
        if self.options.relay_url:
            try:
                namespace = await asyncio.to_thread(sandbox.network_namespace)
                # Past its limits the sandbox is ended: SandboxDied, the sample's reward 0.
                route = LoopbackRoute(namespace, self.options.relay_url, RELAY_PREFIX,
                                      on_violation=sandbox.end)
                self._route = await route.__aenter__()
            except BaseException:
                self._sandbox = None
                await sandbox.stop()
                raise
        # Harbor's output folders (agent logs, verifier logs, artifacts) are the environment's
        # to create since 0.26; a task image need not have them.
        paths = EnvironmentPaths.for_os(self.os)
        await self.ensure_dirs([paths.agent_dir, paths.verifier_dir, paths.artifacts_dir])

    async def stop(self, delete: bool) -> None:
        if not self._owned:
            return
        sandbox, self._sandbox = self._sandbox, None
        route, self._route = self._route, None
        if route is not None:
            try:
                await route.__aexit__(None, None, None)
            except Exception as exc:  # noqa: BLE001 - the sandbox goes whatever the route did
                log.warning("closing the relay route failed: %s", exc)
        if sandbox is not None:
            await sandbox.stop()  # nothing of a sandbox outlives it, delete or not

    @property
    def sandbox(self) -> Sandbox:
        if self._sandbox is None:
            raise RuntimeError("the environment is not started")
        return self._sandbox

    async def exec(self, command: str, cwd: str | None = None,
                   env: dict[str, str] | None = None, timeout_sec: int | None = None,
                   user: str | int | None = None) -> ExecResult:
        result = await self.sandbox.exec(command, timeout=timeout_sec, cwd=cwd,
                                         env=self._merge_env(env),
                                         user=self._resolve_user(user))
        return ExecResult(stdout=result.stdout, stderr=result.stderr,
                          return_code=result.exit_code)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        await self.sandbox.upload(Path(source_path), target_path)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        await self.sandbox.upload(Path(source_dir), target_dir)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        data = await self.sandbox.read_file(source_path)
        if data is None:
            raise FileNotFoundError(f"{source_path} is not a regular file in the sandbox")
        await asyncio.to_thread(_write, Path(target_path), data)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        buffer = io.BytesIO()
        with BundleWriter(buffer, ArtifactLimits()) as writer:
            found = await self.sandbox.collect(source_dir.rstrip("/") or "/", writer)
        if not found:
            raise FileNotFoundError(f"{source_dir} does not exist in the sandbox")
        await asyncio.to_thread(extract_bundle, buffer.getvalue(), source_dir, Path(target_dir))


def read_only_binds(mounts: list[ServiceVolumeConfig]) -> dict[str, str]:
    """Harbor's `mounts` (the job's environment.mounts) as our sandbox's read-only binds
    (sandbox path -> host folder). Anything else would let the agent write to the host."""
    binds = {}
    for mount in mounts:
        if mount["type"] != "bind" or not mount.get("read_only"):
            raise ValueError(f"skyrl-agent environments take read-only bind mounts only, not "
                             f"{mount['source']} -> {mount['target']}")
        binds[mount["target"]] = str(Path(mount["source"]).resolve())
    return binds


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
