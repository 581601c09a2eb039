"""Where a sample's final state is kept: the artifact bundle its episode collected (by default
the task's working directory; for repository tasks that is the repository, i.e. the patch and
everything around it). `skyrl-agent eval --regrade` verifies it again in a fresh sandbox.
"""

from __future__ import annotations

from pathlib import Path


def sample_stem(task_id: str, sample_index: int) -> str:
    """A file name for one sample: `demo/hello-file`, 3 -> `demo__hello-file#3`."""
    return f"{task_id.replace('/', '__')}#{sample_index}"


def state_path(run_dir: Path, task_id: str, sample_index: int) -> Path:
    return run_dir / "final_state" / f"{sample_stem(task_id, sample_index)}.tar.gz"
