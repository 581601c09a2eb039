"""Extract an archive (and read a value from what it holds)."""

from __future__ import annotations

import gzip
import io
import random
import tarfile

from skyrl_agent.tasks.families.base import Blueprint, Family, check_answer, check_file
from skyrl_agent.tasks.families.words import ADJECTIVES, FOLDERS, NOUNS, distinct, phrase

_MTIME = 1_700_000_000
"""Every member's modification time: the archive's bytes depend on the seed alone."""


def tar_gz(members: dict[str, bytes]) -> bytes:
    """A gzipped tar of `members` (paths -> bytes) with their folders, reproducible byte for
    byte: sorted names, fixed times, owner root, no gzip name or time."""
    folders = sorted({"/".join(path.split("/")[:i]) for path in members
                      for i in range(1, path.count("/") + 1)})
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for folder in folders:
            info = tarfile.TarInfo(folder)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, _MTIME
            tar.addfile(info)
        for path in sorted(members):
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(members[path]), 0o644, _MTIME
            tar.addfile(info, io.BytesIO(members[path]))
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, filename="") as packed:
        packed.write(raw.getvalue())
    return out.getvalue()


def build_extract(rng: random.Random, difficulty: int) -> Blueprint:
    name = rng.choice(NOUNS)
    out = f"/app/{rng.choice(FOLDERS)}"
    key = f"{rng.choice(ADJECTIVES)}_{rng.choice(('id', 'code', 'token', 'level'))}"
    value = f"{rng.choice(NOUNS)}{rng.randint(10, 9999)}"
    settings_dir = "/".join([name, *distinct(rng, NOUNS, 2, avoid=(name,))]) \
        if difficulty == 3 else name
    members = {f"{name}/README.txt": f"{phrase(rng, 3)}\n".encode(),
               f"{settings_dir}/settings.ini": "".join(
                   [f"{rng.choice(NOUNS)}_{i}={rng.randint(1, 99)}\n" for i in range(2)]
                   + [f"{key}={value}\n"]).encode()}
    for extra in distinct(rng, NOUNS, rng.randint(1, 2 + difficulty), avoid=(name,)):
        members[f"{name}/data/{extra}.txt"] = f"{phrase(rng, 2)}\n".encode()
    archive = f"{name}.tar.gz"
    steps = [f"mkdir -p {out}", f"tar -xzf /app/{archive} -C {out}"]
    checks = [check_file(f"{out}/{path}", data) for path, data in sorted(members.items())]
    instruction = f"Extract the archive `/app/{archive}` into the folder `{out}`"
    if difficulty == 1:
        instruction += (f" (create it), keeping the paths stored in the archive: the member "
                        f"`{name}/README.txt` must end up at `{out}/{name}/README.txt`.\n")
        plan = f"Extract the archive into {out} with tar."
    else:
        where = (f"`{settings_dir}/settings.ini`" if difficulty == 2 else
                 "a file named `settings.ini` somewhere inside it")
        instruction += (f" (create it), keeping the paths stored in the archive. Then find the "
                        f"line `{key}=...` in {where} and write only its value to "
                        "`/app/answer.txt`.\n")
        source = f"{out}/{settings_dir}/settings.ini" if difficulty == 2 else f"-r {out}"
        steps.append(f"grep -h '^{key}=' {source} | cut -d= -f2 > /app/answer.txt")
        checks.append(check_answer("/app/answer.txt", value))
        plan = f"Extract the archive into {out} with tar, then copy the value of {key}."
    checks.append(f'is_file /app/{archive} || fail "/app/{archive} was removed"')
    return Blueprint(instruction=instruction, checks="\n".join(checks), solution=tuple(steps),
                     plan=plan, files={archive: tar_gz(members)})


FAMILIES = (
    Family("extract-archive", "Extract a tar.gz archive and read a value from it.",
           ("extract it", "extract it and read a value from a named file",
            "extract it and find the file holding a value"), build_extract,
           category="archives"),
)
