"""`harbor:docker` on machines Harbor's docker environment does not expect.

Two gaps, each closed with what Harbor or this project already has:

- Harbor drives containers through `docker compose` (Compose v2). Where only Compose 1.x
  (`docker-compose`, what Debian 12 packages) is installed, Harbor's own environment runs with
  the Compose-1 dialect Harbor already speaks for podman-compose 1.x: `up` without `--wait`, no
  `compose cp` (the engine's `docker cp` both ways: Harbor's fallback for uploads runs a command
  in the working directory, which a restore may just have removed); and `exec -T`, since
  Compose 1.x allocates a terminal unless told not to, where v2 sees that there is none.
- Harbor builds the task's Dockerfile itself, and its `FROM ubuntu:24.04` fails on an engine
  that cannot pull. The image is built instead by our docker backend (the same Dockerfile,
  base images mapped by `sandbox.docker.base_images`, cached by content hash) and handed to
  Harbor as the task's prebuilt image, so both backends run the same image.
"""

from __future__ import annotations

import asyncio
import functools
import shutil
import subprocess
from typing import Any

from skyrl_agent.config import SandboxConfig
from skyrl_agent.sandboxes.base import SandboxSpec, UnsupportedEnvironment


@functools.cache
def compose_frontend() -> str:
    """`v2` (the `docker compose` plugin), else `v1` (`docker-compose`); an error for neither."""
    try:
        found = subprocess.run(["docker", "compose", "version"], capture_output=True,
                               timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        found = False
    if found:
        return "v2"
    if shutil.which("docker-compose"):
        return "v1"
    raise UnsupportedEnvironment("harbor:docker needs Docker Compose: install the compose "
                                 "plugin, or docker-compose (apt-get install docker-compose)")


@functools.cache
def compose1_environment() -> type:
    """Harbor's DockerEnvironment, speaking Compose 1.x."""
    from harbor.environments.docker.docker import DockerEnvironment
    from harbor.environments.docker.runtime import ContainerRuntime

    runtime = ContainerRuntime(engine=("docker",), compose=("docker-compose",),
                               supports_compose_wait=False, supports_compose_cp=False,
                               supports_compose_project_directory=True)

    class Compose1DockerEnvironment(DockerEnvironment):
        @classmethod
        def runtime(cls) -> Any:
            return runtime

        async def _run_docker_compose_command(self, command: list[str], *args: Any,
                                              **kwargs: Any) -> Any:
            if command[:1] == ["exec"] and "-T" not in command:
                command = ["exec", "-T", *command[1:]]
            return await super()._run_docker_compose_command(command, *args, **kwargs)

        async def upload_file(self, source_path: Any, target_path: str) -> None:
            await self._engine_copy(str(source_path), target_path)

        async def upload_dir(self, source_dir: Any, target_dir: str) -> None:
            await self._engine_copy(f"{source_dir}/.", target_dir)

        async def _engine_copy(self, source: str, target: str) -> None:
            container = await self._platform._resolve_service_container("main")
            process = await asyncio.create_subprocess_exec(
                "docker", "cp", source, f"{container}:{target}",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
            output, _ = await process.communicate()
            if process.returncode:
                raise RuntimeError(f"docker cp into {target} failed: "
                                   f"{output.decode(errors='replace')[-300:]}")

    return Compose1DockerEnvironment


async def prebuilt_image(spec: SandboxSpec, config: SandboxConfig) -> str:
    """The task's image, built (once, cached) by the docker backend."""
    from skyrl_agent.sandboxes.docker import DockerSandbox

    return await DockerSandbox(spec, config).built_image()
