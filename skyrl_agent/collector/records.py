"""Trajectories as plain JSON-ready data (for reports and exports)."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any



def to_plain(value: Any) -> Any:
    """Dataclasses, mappings, tuples and enums as dicts, lists and strings."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_plain(v) for v in value]
    return value
