"""The staged benchmarks' wall-clock bookkeeping (benchmarks/learning_curve.py, shared by
benchmarks/summarization.py): a stage stopped part-way and resumed reports the work of both
passes, and a finished stage skipped on a resume keeps the time of the pass that did it."""
import importlib.util
import sys
import time
from pathlib import Path

import pytest


def _load_benchmark(name: str):
    """Load one benchmark script without putting benchmarks/ on sys.path, where its tinker.py
    would shadow the tinker SDK for every later test."""
    spec = importlib.util.spec_from_file_location(
        f"benchmark_{name}", Path(__file__).parents[1] / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    return module


_learning_curve = _load_benchmark("learning_curve")
Stages, timed = _learning_curve.Stages, _learning_curve.timed


def _stopped_after(seconds: float) -> None:
    time.sleep(seconds)
    raise KeyboardInterrupt  # as Ctrl-C (or SIGTERM's RunStopped) ends a stage


def test_a_resumed_stage_reports_the_work_of_every_pass(tmp_path):
    path = tmp_path / "stages.json"
    with pytest.raises(KeyboardInterrupt):
        timed(Stages.load(path), "train", lambda: _stopped_after(0.3))
    stopped = Stages.load(path).recorded["train"]
    assert not stopped.finished and stopped.seconds >= 0.3
    timed(Stages.load(path), "train", lambda: time.sleep(0.1))
    resumed = Stages.load(path).recorded["train"]
    assert resumed.finished and resumed.seconds >= 0.4
    assert resumed.load_before == stopped.load_before  # the stage began in the first pass


def test_a_finished_stage_is_skipped_with_its_time_kept(tmp_path):
    path = tmp_path / "stages.json"
    timed(Stages.load(path), "eval", lambda: "first")
    first = Stages.load(path).recorded["eval"]
    assert timed(Stages.load(path), "eval", lambda: time.sleep(0.3) or "stored") == "stored"
    assert Stages.load(path).recorded["eval"] == first
