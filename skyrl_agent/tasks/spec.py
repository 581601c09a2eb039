"""One Harbor task directory, parsed with harbor's own models so any Harbor task loads the same."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from harbor.models.task.config import NetworkMode, TaskConfig
from harbor.models.task.task import Task, strip_canary
from pydantic import ValidationError

from skyrl_agent.errors import TaskError
from skyrl_agent.tasks.files import check_task_tree, read_task_file, read_task_text
from skyrl_agent.types import Reward

DEFAULT_AGENT_TIMEOUT_S = 600.0
CHALLENGE_FILE = "/tests/challenge.json"
"""Where a grader's per-verification secret is put, beside test.sh (LogGrader.challenge)."""


class LogGrader(Protocol):
    """Grades a task on the host from its test output, instead of a reward file the tests
    write (SWE-bench-format tasks: swebench's log parsers decide resolved)."""

    @property
    def test_output(self) -> str:
        """Absolute sandbox path of the file test.sh's test command writes."""
        ...

    def challenge(self) -> Challenger | None:
        """A fresh secret for one verification, written to the sandbox before test.sh runs
        (None: this grader needs none)."""
        ...

    def grade(self, script_log: str, test_output: str | None,
              challenge: Any = None) -> Reward:
        """The reward from test.sh's own output and the test command's (None when that file
        is missing), both read by the host after every process of the run ended, judged
        against the verification's challenge."""
        ...


TWIN_SUFFIX = "~impossible-twin"
"""What an impossible twin's name adds to its task's: its trajectories are known by it."""


def impossible_twin(task: TaskSpec) -> TaskSpec | None:
    """The task's impossible twin: the same instruction and sandbox, graded so that no honest
    change passes (None for a task whose grader cannot make one)."""
    maker = getattr(task.grader, "impossible_twin", None)
    twin_grader = maker() if maker is not None else None
    if twin_grader is None:
        return None
    return dataclasses.replace(task, name=task.name + TWIN_SUFFIX, grader=twin_grader,
                               impossible=True)


def is_impossible_twin(task_id: str) -> bool:
    """Whether a trajectory's task was an impossible twin (any reward on it was forged)."""
    return task_id.endswith(TWIN_SUFFIX)


class Challenger(Protocol):
    """One verification's secret, as the sandbox receives it."""

    def to_json(self) -> str:
        ...


@dataclass(frozen=True)
class TaskSpec:
    """A loaded task: what an environment needs to build a sandbox, instruct an agent and verify."""

    name: str
    """`[task] name` from task.toml, or the directory name."""
    task_dir: Path
    """Absolute path of the task directory."""
    instruction: str
    """instruction.md, given to the agent verbatim (canary lines stripped)."""
    config: TaskConfig
    """harbor's parsed task.toml."""
    grader: LogGrader | None = None
    """When set, the reward comes from grading test.sh's output on the host, and reward files
    are ignored."""
    instruction_images: tuple[tuple[str, bytes], ...] = ()
    """The images instruction.md shows (`![text](picture.png)`, a path inside the task
    directory), by the link's path: a vision model sees them where the links are."""
    impossible: bool = False
    """An impossible twin (impossible_twin): no honest work passes its tests, so any reward it
    earns was forged; never trained on, counted as `hacks/impossible_twin_rate`."""

    @property
    def environment_dir(self) -> Path:
        return self.task_dir / "environment"

    @property
    def dockerfile(self) -> Path:
        return self.environment_dir / "Dockerfile"

    @property
    def tests_dir(self) -> Path:
        return self.task_dir / "tests"

    @property
    def solution_dir(self) -> Path:
        return self.task_dir / "solution"

    @property
    def agent_timeout_s(self) -> float:
        return self.config.agent.timeout_sec or DEFAULT_AGENT_TIMEOUT_S

    @property
    def verifier_timeout_s(self) -> float:
        return self.config.verifier.timeout_sec

    @property
    def network_allowed(self) -> bool:
        """Network only when task.toml asks for it explicitly: harbor's default is public, ours
        none."""
        env = self.config.environment
        return "network_mode" in env.model_fields_set and env.network_mode == NetworkMode.PUBLIC


def _validation_line(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    return f"{where}: {err['msg']}" if where else err["msg"]


IMAGE_LINK = re.compile(r"!\[[^\]\n]*\]\(([^)\s]+)\)")
"""A Markdown image: `![alt text](path)`."""
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
MAX_INSTRUCTION_IMAGE_BYTES = 8 << 20


def linked_images(task_dir: Path, instruction: str) -> tuple[tuple[str, bytes], ...]:
    """The bytes of each image the instruction links, by link path. Remote links are left as
    text; a local one must be a PNG/JPEG file of the task, read by tasks/files.py (no link on
    its path, no hard link, bytes that decode as PNG/JPEG within the vision bounds)."""
    images: dict[str, bytes] = {}
    for link in IMAGE_LINK.findall(instruction):
        if "://" in link or link in images:
            continue
        if Path(link).suffix.lower() not in IMAGE_SUFFIXES:
            raise TaskError(f"instruction image {link} in {task_dir}: only .png and .jpg are "
                            "shown to a model")
        images[link] = read_task_file(task_dir, link, MAX_INSTRUCTION_IMAGE_BYTES, "image")
    return tuple(images.items())


def load_task(path: Path | str) -> TaskSpec:
    """Parse a task directory; any defect becomes a TaskError naming the file and the problem."""
    task_dir = Path(path).resolve()
    if not task_dir.is_dir():
        raise TaskError(f"task directory not found: {path}")
    if not (task_dir / "task.toml").is_file():
        raise TaskError(f"not a Harbor task: {task_dir} has no task.toml")
    check_task_tree(task_dir)  # before harbor reads any of it (tasks/files.py)
    try:
        task = Task(task_dir)  # harbor's own checks of the folder
        # What we use is what tasks/files.py read, not what harbor read by path.
        config = TaskConfig.model_validate_toml(read_task_text(task_dir, "task.toml"))
    except tomllib.TOMLDecodeError as exc:
        raise TaskError(f"malformed task.toml in {task_dir}: {exc}") from None
    except ValidationError as exc:
        raise TaskError(f"invalid task.toml in {task_dir}: {_validation_line(exc)}") from None
    except (OSError, ValueError) as exc:
        raise TaskError(f"invalid task {task_dir}: {exc}") from None
    if task.has_steps:
        raise TaskError(f"multi-step tasks are not supported yet: {task_dir}")
    instruction = strip_canary(read_task_text(task_dir, "instruction.md"))
    name = config.task.name if config.task is not None else task_dir.name
    spec = TaskSpec(name=name, task_dir=task_dir, instruction=instruction, config=config,
                    instruction_images=linked_images(task_dir, instruction))
    if not spec.dockerfile.is_file() and not task.config.environment.docker_image:
        raise TaskError(f"task {task_dir} has neither environment/Dockerfile nor a docker_image")
    return spec
