"""Small builders for test tasks (real Harbor task directories on disk)."""

from __future__ import annotations

from pathlib import Path

DOCKERFILE = """FROM ubuntu:24.04
WORKDIR /app
"""

TASK_TOML = """schema_version = "1.4"

[task]
name = "test/{name}"

[agent]
timeout_sec = {agent_timeout}

[verifier]
timeout_sec = {verifier_timeout}

[environment]
memory_mb = {memory_mb}
network_mode = "no-network"
"""


def make_task(root: Path, name: str, test_sh: str, solve_sh: str = "true\n",
              dockerfile: str = DOCKERFILE, files: dict[str, str] | None = None,
              agent_timeout: float = 60, verifier_timeout: float = 30,
              memory_mb: int = 512) -> Path:
    """Write a Harbor task dir and return its path."""
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "solution").mkdir()
    (task / "task.toml").write_text(TASK_TOML.format(
        name=name, agent_timeout=agent_timeout, verifier_timeout=verifier_timeout,
        memory_mb=memory_mb))
    (task / "instruction.md").write_text(f"Task {name}.\n")
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    for rel, content in (files or {}).items():
        path = task / "environment" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    (task / "tests" / "test.sh").write_text("#!/bin/bash\n" + test_sh)
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\n" + solve_sh)
    return task
