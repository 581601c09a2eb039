"""SWE-bench-format instances: the record, and reading them from a file or the local HF cache.

An instance is one GitHub issue of a Python repo: the repo at `base_commit`, the issue text, the
gold fix (`patch`), the tests that decide it (`test_patch`, FAIL_TO_PASS, PASS_TO_PASS) and the
`version` that selects the repo's test command. Files are JSONL, JSON (a list) or Parquet;
datasets on the Hugging Face hub are read from the local cache only, never downloaded.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator

from skyrl_agent.errors import TaskError

FILE_SUFFIXES = (".jsonl", ".json", ".parquet")


@dataclass(frozen=True)
class Dataset:
    """A named SWE-bench-format dataset on the Hugging Face hub."""

    hub_name: str
    """The hub id, e.g. princeton-nlp/SWE-bench_Verified."""
    split: str
    """The split read (SWE-bench: test, SWE-Gym: train)."""
    image_namespace: str
    """Where its instance images live (swebench's naming, under this namespace)."""


DATASETS = {
    "swe-bench": Dataset("princeton-nlp/SWE-bench_Verified", "test", "swebench"),
    "swe-bench-verified": Dataset("princeton-nlp/SWE-bench_Verified", "test", "swebench"),
    "swe-bench-lite": Dataset("princeton-nlp/SWE-bench_Lite", "test", "swebench"),
    "swe-gym": Dataset("SWE-Gym/SWE-Gym", "train", "xingyaoww"),
}
"""Names `--tasks` accepts for hub datasets."""


class SweInstance(BaseModel):
    """One SWE-bench-format task instance (the dataset's own column names)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    instance_id: str
    """Unique id, `owner__repo-number` by convention."""
    repo: str
    """`owner/name` on GitHub; selects the test command and the log parser."""
    base_commit: str
    """The commit the agent starts from."""
    problem_statement: str
    """The issue text: the agent's instruction."""
    patch: str
    """The gold fix (the reference solution); never shown to the agent."""
    test_patch: str
    """The tests that grade the fix; applied only at verification."""
    fail_to_pass: tuple[str, ...] = Field(
        validation_alias=AliasChoices("FAIL_TO_PASS", "fail_to_pass"))
    """FAIL_TO_PASS: tests that fail at base_commit and must pass."""
    pass_to_pass: tuple[str, ...] = Field(
        validation_alias=AliasChoices("PASS_TO_PASS", "pass_to_pass"))
    """PASS_TO_PASS: tests that pass at base_commit and must still pass."""
    version: str
    """The repo version, the key of its test spec."""
    environment_setup_commit: str = ""
    """The commit the environment was installed from (kept for reference)."""

    @field_validator("fail_to_pass", "pass_to_pass", mode="before")
    @classmethod
    def _test_list(cls, value: Any) -> Any:
        """The hub stores the lists as JSON strings; files may hold real lists."""
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise ValueError("not a JSON list of test names") from None
        return value

    @field_validator("version", mode="before")
    @classmethod
    def _version_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int | float) else value


def _instance(row: Any, where: str) -> SweInstance:
    if not isinstance(row, dict):
        raise TaskError(f"{where}: not a JSON object")
    try:
        return SweInstance(**row)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "instance"
        name = row.get("instance_id", "?")
        message = err["msg"].removeprefix("Value error, ")
        raise TaskError(f"{where} ({name}): {field}: {message}") from None


def _rows_of(path: Path) -> Iterable[tuple[str, Any]]:
    """(where, row) for each record of a JSONL, JSON or Parquet file."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq
        try:
            table = pq.read_table(path)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds for a bad file
            raise TaskError(f"cannot read {path} as Parquet: {exc}") from None
        return ((f"{path} row {i + 1}", row) for i, row in enumerate(table.to_pylist()))
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TaskError(f"{path}: not JSON ({exc})") from None
        if not isinstance(rows, list):
            raise TaskError(f"{path}: expected a JSON list of instances")
        return ((f"{path} item {i + 1}", row) for i, row in enumerate(rows))
    return _jsonl_rows(path, text)


def _jsonl_rows(path: Path, text: str) -> Iterable[tuple[str, Any]]:
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield f"{path}:{number}", json.loads(line)
        except json.JSONDecodeError as exc:
            raise TaskError(f"{path}:{number}: not JSON ({exc.msg})") from None


def read_instances(path: Path) -> list[SweInstance]:
    """The instances of a JSONL, JSON or Parquet file, in file order; TaskError on any defect."""
    if not path.is_file():
        raise TaskError(f"instance file not found: {path}")
    if path.suffix not in FILE_SUFFIXES:
        raise TaskError(f"{path}: SWE-bench instances come as {', '.join(FILE_SUFFIXES)}")
    instances = [_instance(row, where) for where, row in _rows_of(path)]
    if not instances:
        raise TaskError(f"{path} holds no instances")
    seen: set[str] = set()
    for instance in instances:
        if instance.instance_id in seen:
            raise TaskError(f"{path}: instance {instance.instance_id} appears twice")
        seen.add(instance.instance_id)
    return instances


def missing_dataset_line(name: str, dataset: Dataset) -> str:
    """What to provide when a hub dataset is not on this machine."""
    return (f"{name}: {dataset.hub_name} ({dataset.split} split) is not in the local Hugging "
            "Face datasets cache and is never downloaded here; give a JSONL or Parquet file of "
            f"its instances (--tasks PATH.jsonl), or load {dataset.hub_name} into the cache "
            "(HF_HOME) on a machine with network, then copy the cache here")


def load_dataset_instances(name: str) -> list[SweInstance]:
    """A named hub dataset's instances from the local HF cache (offline); TaskError naming what
    to provide when it is not there or the `datasets` package is missing."""
    dataset = DATASETS[name]
    try:
        import datasets
        import huggingface_hub.constants
    except ImportError:
        raise TaskError(f"{name} needs the datasets package: pip install "
                        "'skyrl-agent[swe]'") from None
    # Offline for this call only: a missing dataset must fail at once, not after the hub
    # client's retries (about 30 s without network).
    saved = datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = huggingface_hub.constants.HF_HUB_OFFLINE = True
    try:
        rows = datasets.load_dataset(dataset.hub_name, split=dataset.split)
    except (ConnectionError, FileNotFoundError, ValueError):
        raise TaskError(missing_dataset_line(name, dataset)) from None
    finally:
        datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE = saved
    return [_instance(row, f"{dataset.hub_name} row {i + 1}") for i, row in enumerate(rows)]
