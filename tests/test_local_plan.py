"""Dockerfile parsing and how the local backend replays (or refuses) each instruction."""

from __future__ import annotations

import pytest

from skyrl_agent.config import SandboxConfig
from skyrl_agent.errors import TaskError
from skyrl_agent.sandboxes.base import SandboxSpec, UnsupportedEnvironment
from skyrl_agent.sandboxes.dockerfile import final_workdir, parse_dockerfile, parse_env
from skyrl_agent.sandboxes.local_plan import plan_local
from skyrl_agent.tasks import load_task
from tests.helpers import make_task


def plan_for(tmp_path, dockerfile: str, files: dict[str, str] | None = None):
    task = load_task(make_task(tmp_path, "plan", "true\n", dockerfile=dockerfile, files=files))
    return plan_local(SandboxSpec.from_task(task, SandboxConfig()))


def test_parse_continuations_comments_and_env():
    text = "FROM a:1\n# comment\nRUN echo one \\\n  && echo two\nENV A=1 B=\"two words\"\n" \
           "ENV LEGACY some value\nWORKDIR /srv\nWORKDIR app\n"
    instructions = parse_dockerfile(text)
    assert [i.keyword for i in instructions] == ["FROM", "RUN", "ENV", "ENV", "WORKDIR", "WORKDIR"]
    assert instructions[1].args == "echo one && echo two"
    assert instructions[1].line == 3
    assert parse_env(instructions[2].args) == {"A": "1", "B": "two words"}
    assert parse_env(instructions[3].args) == {"LEGACY": "some value"}
    assert final_workdir(instructions) == "/srv/app"


def test_copy_workdir_env_and_run_are_replayed(tmp_path):
    plan = plan_for(tmp_path, (
        "FROM ubuntu:24.04\n"
        "RUN apt-get update && apt-get install -y --no-install-recommends python3 git "
        "&& rm -rf /var/lib/apt/lists/*\n"
        "ENV DATA=/app/data\nWORKDIR /app\nCOPY data/ $DATA/\nCOPY one.txt ./\n"
        "RUN mkdir -p /app/out && echo hi > /app/out/x\n"),
        files={"data/a.txt": "a", "one.txt": "1"})
    assert plan.workdir == "/app"
    assert plan.env["DATA"] == "/app/data"
    copies = {(c.source.name, c.destination, c.into_directory) for c in plan.copies}
    assert copies == {("data", "/app/data", True), ("one.txt", "/app", True)}
    # The apt-get line is satisfied by the host and skipped; the mkdir line runs in the sandbox.
    assert plan.run_steps == (("/app", "mkdir -p /app/out && echo hi > /app/out/x"),)


@pytest.mark.parametrize("line, needle", [
    ("RUN apt-get install -y surely-not-a-real-package-xyz", "surely-not-a-real-package-xyz"),
    ("RUN pip install requests", "installs software"),
    ("COPY --from=builder /x /y", "another build stage"),
    ("ADD https://example.org/file /app/", "downloads a URL"),
    ("COPY missing.txt /app/", "not in environment/"),
    # Stops: a COPY/ADD source outside environment/ (host files of the task) being accepted.
    ("COPY ../tests/test.sh /app/", "not in environment/"),
    ("ADD ../solution /app/solution/", "not in environment/"),
    ("COPY one.txt ../task.toml /app/", "not in environment/"),
    # Stops: curl/wget lines being replayed instead of refused (they need the network).
    ("RUN curl -fsSL https://example.org/install.sh | sh", "uses the network"),
    ("RUN mkdir -p /opt && wget -q https://example.org/x.tgz", "uses the network"),
])
def test_unsupported_steps_name_the_docker_backend(tmp_path, line, needle):
    with pytest.raises(UnsupportedEnvironment) as info:
        plan_for(tmp_path, f"FROM ubuntu:24.04\nWORKDIR /app\n{line}\n", files={"one.txt": "1"})
    assert needle in str(info.value)
    assert "--sandbox docker" in str(info.value)


def test_multi_stage_is_refused(tmp_path):
    with pytest.raises(UnsupportedEnvironment, match="multi-stage"):
        plan_for(tmp_path, "FROM a AS build\nRUN true\nFROM b\n")


def test_a_symlink_out_of_environment_is_refused(tmp_path):
    """Stops: a COPY source that is a link inside environment/ to a file outside it."""
    task = make_task(tmp_path, "plan", "true\n",
                     dockerfile="FROM ubuntu:24.04\nWORKDIR /app\nCOPY link /app/\n")
    loaded = load_task(task)
    (task / "environment" / "link").symlink_to(task / "tests" / "test.sh")
    with pytest.raises(UnsupportedEnvironment, match="not in environment/"):
        plan_local(SandboxSpec.from_task(loaded, SandboxConfig()))
    with pytest.raises(TaskError, match=r"environment/link .* symbolic link"):
        load_task(task)  # a task with a link anywhere does not load (tasks/files.py)


def test_arg_defaults_are_substituted(tmp_path):
    """Stops: ARG defaults being ignored. `$NAME` / `${NAME}` of an ARG with a default expand
    in ENV and COPY as the builder does; the ARG itself is not part of the runtime env."""
    plan = plan_for(tmp_path, (
        "FROM ubuntu:24.04\nARG VERSION=1.2.3\nARG SRC=\"data\"\nARG UNSET\n"
        "ENV APP_VERSION=$VERSION TAG=v${VERSION}\nWORKDIR /app\nCOPY $SRC/ /app/${SRC}/\n"),
        files={"data/a.txt": "a"})
    assert plan.env["APP_VERSION"] == "1.2.3" and plan.env["TAG"] == "v1.2.3"
    assert {(c.source.name, c.destination) for c in plan.copies} == {("data", "/app/data")}
    assert not {"VERSION", "SRC", "UNSET"} & set(plan.env)
