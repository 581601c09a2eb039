"""An optimizer state dict keyed by parameter names, the one checkpoint form every backend reads.

torch's `Optimizer.state_dict()` numbers parameters by their position in the optimizer; a
sharded backend's full state dict names them. A checkpoint names them, so a run saved by one
backend resumes on another (the trainable parameters and their order are the same model's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def by_name(state: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """A positional state dict (`Optimizer.state_dict()`) keyed by `names` instead."""
    if _named(state):
        return state
    return {"state": {names[i]: value for i, value in state["state"].items()},
            "param_groups": [{**group, "params": [names[i] for i in group["params"]]}
                             for group in state["param_groups"]]}


def by_position(state: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """A named state dict as `Optimizer.load_state_dict` takes it for an optimizer over the
    parameters `names` (in its order); a name this model lacks is a ValueError."""
    if not _named(state):
        return state
    position = {name: i for i, name in enumerate(names)}
    missing = [name for group in state["param_groups"] for name in group["params"]
               if name not in position]
    if missing:
        raise ValueError(f"the checkpoint's optimizer state is for another model: it has "
                         f"{missing[0]!r}, which this model does not train")
    if len(state["param_groups"]) != 1:
        raise ValueError("the checkpoint's optimizer state has several parameter groups; this "
                         "backend trains one")
    # load_state_dict pairs the group's ids with the optimizer's parameters in order, so the
    # group lists every position in order (a parameter without state starts afresh).
    return {"state": {position[name]: value for name, value in state["state"].items()},
            "param_groups": [{**state["param_groups"][0], "params": list(range(len(names)))}]}


def _named(state: dict[str, Any]) -> bool:
    return any(isinstance(p, str) for group in state["param_groups"] for p in group["params"])
