"""A task's artifact `exclude` drops a matching folder with everything in it, on both backends
(the engine's archive lists a folder's members after it; they went along before)."""

from __future__ import annotations

import io

from skyrl_agent.sandboxes.artifacts import ArtifactLimits, BundleWriter, bundle_names
from skyrl_agent.sandboxes.base import SandboxSpec, create_sandbox
from skyrl_agent.tasks import find_task


async def test_an_excluded_folder_goes_with_its_contents(sandbox_config):
    spec = SandboxSpec.from_task(find_task("demo/hello-file"), sandbox_config)
    async with create_sandbox(spec, sandbox_config) as sandbox:
        made = await sandbox.exec("mkdir -p /app/.git/objects /app/src/.git && "
                                  "echo x > /app/.git/objects/a && echo y > /app/src/.git/b && "
                                  "echo z > /app/src/keep && echo w > /app/.gitignore")
        assert made.ok, made.stderr
        buffer = io.BytesIO()
        with BundleWriter(buffer, ArtifactLimits(), exclude=[".git"]) as writer:
            await sandbox.collect("/app", writer)
    assert sorted(bundle_names(buffer.getvalue())) == [
        "app", "app/.gitignore", "app/src", "app/src/keep"]
