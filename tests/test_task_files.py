"""Task files are read one way, everywhere (tasks/files.py; issue 54, item 6).

Stops: a hard link inside the task folder to a file outside it, which passed the "inside the task
directory" check and sent a host file's bytes to the model as an instruction image; bytes in a
`.png` that were never verified as an image; symlinks and paths out of the folder in every file
the host reads or carries into a sandbox or an image build (task.toml, instruction.md, images,
tests/, solution/, environment/). Each refusal is one line naming the file and the rule.
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest
from PIL import Image

from skyrl_agent.errors import TaskError
from skyrl_agent.tasks.files import (
    copy_task_folder,
    pack_task_folder,
    read_task_file,
    read_task_text,
)
from skyrl_agent.tasks.spec import linked_images, load_task
from tests.helpers import make_task

SECRET = b"host secret: never shown to a model or a sandbox\n"


def _png(color: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (4, 4), color).save(out, format="PNG")
    return out.getvalue()


def _one_line(exc: pytest.ExceptionInfo[TaskError]) -> str:
    text = str(exc.value)
    assert "\n" not in text and "Traceback" not in text
    return text


@pytest.fixture
def task(tmp_path) -> Path:
    return make_task(tmp_path / "tasks", "files", "echo 1 > /logs/verifier/reward.txt\n")


@pytest.fixture
def outside(tmp_path) -> Path:
    """A host file outside every task folder, on the same file system (a hard link needs it)."""
    path = tmp_path / "secret.png"
    path.write_bytes(_png((200, 10, 10)))
    return path


def test_a_hard_linked_instruction_image_is_refused(task, outside):
    """The attack: `pic.png` is a hard link to a file outside the task. Its resolved path is
    inside the task folder; it is still refused, when the image is read and when the task
    loads, with one line that says why."""
    (task / "instruction.md").write_text("Look: ![a picture](pic.png)\n")
    os.link(outside, task / "pic.png")
    with pytest.raises(TaskError) as refused:
        linked_images(task, "Look: ![a picture](pic.png)")
    assert "pic.png" in _one_line(refused) and "hard link" in _one_line(refused)
    with pytest.raises(TaskError, match="hard link") as at_load:
        load_task(task)
    assert "pic.png" in _one_line(at_load)


def test_image_bytes_must_be_a_picture(task):
    """Bytes in a `.png` that are no PNG/JPEG never reach the model."""
    (task / "fake.png").write_bytes(SECRET)
    (task / "real.png").write_bytes(_png((10, 200, 10)))
    with pytest.raises(TaskError, match="is not a PNG or JPEG image") as refused:
        linked_images(task, "![x](fake.png)")
    assert "fake.png" in _one_line(refused)
    assert linked_images(task, "![x](real.png)") == (("real.png", _png((10, 200, 10))),)


@pytest.mark.parametrize("rel", ["../secret.png", "/etc/passwd", "a/../../secret.png", ""])
def test_a_path_out_of_the_task_is_refused(task, outside, rel):
    with pytest.raises(TaskError, match="is not a path inside the task folder") as refused:
        read_task_file(task, rel, 1 << 20)
    _one_line(refused)


def test_symlinks_are_refused_on_the_file_and_on_its_way(task, outside):
    (task / "linked.png").symlink_to(outside)
    (task / "pictures").symlink_to(outside.parent)  # a folder on the way is a link
    with pytest.raises(TaskError, match=r"linked\.png .* is a symbolic link") as refused:
        read_task_file(task, "linked.png", 1 << 20, "image")
    _one_line(refused)
    with pytest.raises(TaskError, match="lies under pictures, which is a symbolic link"):
        read_task_file(task, "pictures/secret.png", 1 << 20, "image")


def test_fifos_sizes_and_text_are_checked(task):
    os.mkfifo(task / "pipe")
    with pytest.raises(TaskError, match="is a FIFO"):
        read_task_file(task, "pipe", 100)  # opened without blocking, then refused
    (task / "big.txt").write_bytes(b"x" * 101)
    with pytest.raises(TaskError, match="larger than 100 bytes"):
        read_task_file(task, "big.txt", 100)
    (task / "latin.txt").write_bytes(b"caf\xe9")
    with pytest.raises(TaskError, match="not UTF-8"):
        read_task_text(task, "latin.txt")
    assert read_task_text(task, "instruction.md") == "Task files.\n"


@pytest.mark.parametrize(
    "planted",
    ["task.toml", "instruction.md", "tests/test.sh", "solution/solve.sh", "environment/secret"],
)
@pytest.mark.parametrize("how", ["hard link", "symbolic link"])
def test_a_task_with_a_link_anywhere_does_not_load(task, outside, planted, how):
    """Every file harbor, the verifier, the oracle or an image build reads: a link in its
    place (or beside it, for the folders carried whole) stops the task at load."""
    (task / planted).unlink(missing_ok=True)
    (os.link if how == "hard link" else os.symlink)(outside, task / planted)
    with pytest.raises(TaskError, match=how) as refused:
        load_task(task)
    assert planted in _one_line(refused)


def test_folders_are_carried_as_checked_at_every_copy(task, outside, tmp_path):
    """tests/, solution/ and environment/ go into sandboxes and builds from the same walk,
    even when a link appears after the task loaded."""
    load_task(task)
    (task / "tests" / "data").mkdir()
    (task / "tests" / "data" / "x.txt").write_text("x")
    with tarfile.open(fileobj=io.BytesIO(pack_task_folder(task, "tests", "tests"))) as tar:
        assert sorted(tar.getnames()) == [
            "tests",
            "tests/data",
            "tests/data/x.txt",
            "tests/test.sh",
        ]
        assert tar.extractfile("tests/test.sh").read().endswith(b"reward.txt\n")  # type: ignore[union-attr]
    os.link(outside, task / "tests" / "data" / "leak.png")
    with pytest.raises(TaskError, match=r"tests/data/leak\.png .* hard link"):
        pack_task_folder(task, "tests", "tests")
    os.symlink(outside, task / "environment" / "leak.png")
    with pytest.raises(TaskError, match=r"environment/leak\.png .* symbolic link"):
        copy_task_folder(task, "environment", tmp_path / "context")
    assert not (tmp_path / "context" / "leak.png").exists()
