"""Families of plain text work: write a file, count, replace words, sort lines."""

from __future__ import annotations

import random

from skyrl_agent.tasks.families.base import Blueprint, Family, check_answer, check_file
from skyrl_agent.tasks.families.words import (
    ADJECTIVES,
    FILE_STEMS,
    FOLDERS,
    NOUNS,
    distinct,
    phrase,
)


def _lines_block(lines: list[str]) -> str:
    return "```\n" + "\n".join(lines) + "\n```"


def _printf(lines: list[str]) -> str:
    """A printf argument writing these lines (the words need no quoting but the quotes)."""
    return "'" + "".join(f"{line}\\n" for line in lines) + "'"


def build_write_file(rng: random.Random, difficulty: int) -> Blueprint:
    count = {1: 1, 2: rng.randint(2, 3), 3: rng.randint(3, 4)}[difficulty]
    lines = [phrase(rng, rng.randint(2, 3)) for _ in range(count)]
    stem = rng.choice(FILE_STEMS)
    folder = f"/app/{rng.choice(FOLDERS)}" if difficulty == 3 else "/app"
    path = f"{folder}/{stem}.txt"
    noun = "line" if count == 1 else f"{count} lines"
    ending = "ending" if count == 1 else "each ending"
    instruction = (f"Create the file `{path}` containing exactly the following {noun}, {ending} "
                   f"with a newline:\n\n{_lines_block(lines)}\n")
    write = f"printf {_printf(lines)} > {path}"
    solution = (f"mkdir -p {folder}", write) if difficulty == 3 else (write,)
    return Blueprint(instruction=instruction,
                     checks=check_file(path, "".join(f"{line}\n" for line in lines)),
                     solution=solution, plan=f"Write the {noun} into {path} with printf.")


def _text_file(rng: random.Random, lines: int) -> list[str]:
    return [phrase(rng, rng.randint(1, 4)) if rng.random() < 0.9 else rng.choice(NOUNS)
            for _ in range(lines)]


def build_count(rng: random.Random, difficulty: int) -> Blueprint:
    stem = rng.choice(FILE_STEMS)
    path = f"/app/{stem}.txt"
    lines = _text_file(rng, rng.randint(3, 12))
    if difficulty == 1:
        answer, what, command = len(lines), "the number of lines", f"wc -l < {path}"
    elif difficulty == 2:
        answer = sum(len(line.split()) for line in lines)
        what, command = "the number of words", f"wc -w < {path}"
    else:
        word = rng.choice(ADJECTIVES)
        holders = rng.sample(range(len(lines)), rng.randint(1, max(1, len(lines) // 2)))
        for index in holders:
            if word not in lines[index].split():
                lines[index] = f"{word} {lines[index]}"
        answer = sum(word in line.split() for line in lines)
        what = f"the number of lines that contain the word `{word}`"
        command = f"grep -c -w {word} {path}"
    instruction = (f"Count {what} in `{path}` and write that number, digits only, to "
                   "`/app/count.txt`.\n")
    return Blueprint(instruction=instruction, checks=check_answer("/app/count.txt", str(answer)),
                     solution=(f"{command} > /app/count.txt",),
                     plan=f"Count with {command.split()[0]} and write the number to "
                          "/app/count.txt.",
                     files={f"{stem}.txt": "".join(f"{line}\n" for line in lines).encode()})


def _with_words(rng: random.Random, words: list[str], filler: list[str], lines: int) -> list[str]:
    """Lines of filler words where each of `words` appears at least once."""
    text = [rng.sample(filler, rng.randint(2, 4)) for _ in range(lines)]
    for word in words:
        for _ in range(rng.randint(1, 3)):
            row = rng.choice(text)
            row.insert(rng.randint(0, len(row)), word)
    return [" ".join(row) for row in text]


def build_replace(rng: random.Random, difficulty: int) -> Blueprint:
    pairs = 2 if difficulty == 2 else 1
    old = distinct(rng, NOUNS, pairs)
    new = distinct(rng, NOUNS, pairs, avoid=tuple(old))
    # sed replaces substrings: no filler word may contain a word being replaced.
    filler = [w for w in ADJECTIVES if not any(o in w for o in old)]
    sed = " ".join(f"-e 's/{a}/{b}/g'" for a, b in zip(old, new, strict=True)) if pairs > 1 \
        else f"'s/{old[0]}/{new[0]}/g'"
    if difficulty == 3:
        folder = f"/app/{rng.choice(FOLDERS)}"
        targets = [f"{folder}/{stem}.txt" for stem in rng.sample(FILE_STEMS, rng.randint(2, 3))]
        where, glob = f"every `.txt` file in `{folder}`", f"{folder}/*.txt"
    else:
        targets = [f"/app/{rng.choice(FILE_STEMS)}.txt"]
        where, glob = f"`{targets[0]}`", targets[0]
    swap = dict(zip(old, new, strict=True))
    files, checks = {}, []
    for target in targets:
        lines = _with_words(rng, old, filler, rng.randint(3, 6))
        files[target.removeprefix("/app/")] = "".join(f"{line}\n" for line in lines).encode()
        replaced = "".join(" ".join(swap.get(w, w) for w in line.split()) + "\n"
                           for line in lines)
        checks.append(check_file(target, replaced))
    swaps = " and ".join(f"the word `{a}` with `{b}`" for a, b in swap.items())
    instruction = (f"Replace every occurrence of {swaps} in {where}, editing the file"
                   f"{'s' if len(targets) > 1 else ''} in place. Change nothing else.\n")
    return Blueprint(instruction=instruction, checks="\n".join(checks),
                     solution=(f"sed -i {sed} {glob}",),
                     plan="Replace the words in place with sed.", files=files)


def build_sort(rng: random.Random, difficulty: int) -> Blueprint:
    stem = rng.choice(FILE_STEMS)
    path = f"/app/{stem}.txt"
    if difficulty == 3:
        values = [str(v) for v in rng.sample(range(1, 1000), rng.randint(4, 9))]
        result = sorted(values, key=int, reverse=True)
        how, flags = "numerically, from the largest number to the smallest", "-nr"
    else:
        values = rng.sample(NOUNS, rng.randint(4, 9))
        if difficulty == 2:
            values += rng.sample(values, rng.randint(1, 3))
            rng.shuffle(values)
        result = sorted(set(values))
        how = "alphabetically" + (", keeping each distinct line only once"
                                  if difficulty == 2 else "")
        flags = "-u" if difficulty == 2 else ""
    command = " ".join(part for part in ("sort", flags, path) if part)
    instruction = (f"Sort the lines of `{path}` {how}, and write the result to "
                   "`/app/sorted.txt` (one item per line).\n")
    return Blueprint(instruction=instruction,
                     checks=check_file("/app/sorted.txt", "".join(f"{v}\n" for v in result)),
                     solution=(f"{command} > /app/sorted.txt",),
                     plan="Sort the lines with sort into /app/sorted.txt.",
                     files={f"{stem}.txt": "".join(f"{v}\n" for v in values).encode()})


FAMILIES = (
    Family("write-file", "Create a file with exact given lines.",
           ("one line in /app", "two or three lines", "three or four lines in a new folder"),
           build_write_file),
    Family("count", "Count lines or words of a file and write the number.",
           ("count lines", "count words", "count lines holding a given word"), build_count,
           category="text"),
    Family("replace-text", "Replace words in files, in place.",
           ("one word in one file", "two words in one file", "one word in every file of a "
            "folder"), build_replace, category="text"),
    Family("sort-lines", "Sort the lines of a file into another.",
           ("alphabetically", "alphabetically without duplicates", "numerically, descending"),
           build_sort, category="text"),
)
