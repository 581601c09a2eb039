"""Before a docker run: does the engine have the images the tasks build on?

A task image is built FROM a base image (mapped to a local stand-in by
`sandbox.docker.base_images` when the engine lacks the public one) or is a prebuilt
`docker_image`. An image the engine lacks is pulled once here; when that fails (offline
machines), the run stops before any work with one line naming the image and what to do, not
with one failed build per sample.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from skyrl_agent.config import SandboxConfig
from skyrl_agent.sandboxes.base import SandboxSpec, UnsupportedEnvironment
from skyrl_agent.sandboxes.dockerfile import Instruction, parse_dockerfile, split_flags

if TYPE_CHECKING:
    from docker import DockerClient


def from_images(instructions: list[Instruction]) -> list[str]:
    """The images FROM lines name, leaving out `scratch`, earlier stages and `$ARG` names."""
    images: list[str] = []
    stages: set[str] = set()
    for ins in instructions:
        if ins.keyword != "FROM":
            continue
        _, words = split_flags(ins.args)
        if not words:
            continue
        if len(words) >= 3 and words[1].lower() == "as":
            stages.add(words[2].lower())
        image = words[0]
        if image.lower() not in stages and image != "scratch" and "$" not in image:
            images.append(image)
    return images


def base_images_of(spec: SandboxSpec) -> list[str]:
    """The images a sandbox of `spec` is built from (or is)."""
    if spec.dockerfile is not None:
        return from_images(parse_dockerfile(spec.dockerfile_text()))
    return [spec.docker_image] if spec.docker_image else []


def _has(client: DockerClient, name: str) -> bool:
    import docker
    try:
        client.images.get(name)
        return True
    except docker.errors.ImageNotFound:
        return False


def _obtainable(client: DockerClient, image: str, config: SandboxConfig) -> bool:
    """The image or its local stand-in is in the engine, or the image can be pulled."""
    import docker
    if _has(client, image) or _has(client, config.docker.base_images.get(image, image)):
        return True
    try:
        client.images.pull(image)
        return True
    except docker.errors.DockerException:
        return False


def check_images(client: DockerClient, specs: Sequence[SandboxSpec], config: SandboxConfig,
                 task_tag: Callable[[SandboxSpec], str]) -> None:
    """UnsupportedEnvironment naming the first image the engine lacks and cannot pull, for the
    specs whose task image (`task_tag`) is not built yet."""
    users: dict[str, list[str]] = {}
    for spec in specs:
        if spec.dockerfile is None or not _has(client, task_tag(spec)):
            for image in base_images_of(spec):
                users.setdefault(image, []).append(spec.name)
    for image, names in users.items():
        if _obtainable(client, image, config):
            continue
        stand_in = config.docker.base_images.get(image)
        hint = (f" nor its local stand-in {stand_in} (scripts/build-base-image.sh builds it)"
                if stand_in else "")
        more = f" and {len(names) - 1} more" if len(names) > 1 else ""
        raise UnsupportedEnvironment(
            f"the Docker engine has no image {image}{hint}, needed by {names[0]}{more}, and "
            "cannot pull it: load it into the engine (docker load -i FILE), or choose tasks "
            "that do not need it")
