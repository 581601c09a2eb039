"""Long-horizon families: tasks whose reading does not fit the context at once.

`follow-clues`: a trail of clue files, each a screenful of filler around two lines, `code: WORD`
and `next: FILE` (the last says `next: none`). The answer is every code of the trail, in order.
Decoy files in the same folder hold codes too and point into the trail, so neither reading
every file nor grepping every `code:` line gives the answer: each file must be read to learn
which one comes next, and the codes found early must be carried to the end.

Sized for the embedded budget (a 2,048-token context; SmolLM2's tokenizer): the trail's files
take 380-540 tokens at difficulty 1, so a walkthrough fits; 1,200-1,500 at difficulty 2 and
1,900-2,300 at difficulty 3, which with the system prompt, the task and the replies is more
than the context holds. An agent gets there only by carrying what it found across a context
reset (a summary, or notes it keeps in files).
"""

from __future__ import annotations

import random

from skyrl_agent.tasks.families.base import Blueprint, Family, Step, check_answer
from skyrl_agent.tasks.families.words import ADJECTIVES, NOUNS

TRAIL_LENGTHS = {1: 2, 2: 6, 3: 9}
"""Clue files on the trail, by difficulty."""
DECOYS = {1: 2, 2: 3, 3: 4}
"""Clue files off the trail, by difficulty."""
FILLER_LINES = (14, 20)
"""Filler lines per clue file (inclusive range): about 250 tokens, well inside a 48-line pane."""
CLUES = "/app/clues"
ANSWER = "/app/answer.txt"


def _filler_line(rng: random.Random) -> str:
    """A line of a field log: none holds `code:` or `next:`, so only those two lines stand
    out."""
    return (f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d} "
            + " ".join([*rng.sample(ADJECTIVES, rng.randint(2, 3)), rng.choice(NOUNS),
                        rng.choice(("seen", "noted", "moved", "checked", "logged")),
                        rng.choice(("near", "by", "past", "under")), rng.choice(NOUNS)]))


def _clue_file(rng: random.Random, code: str, following: str) -> bytes:
    lines = [_filler_line(rng) for _ in range(rng.randint(*FILLER_LINES))]
    first = rng.randrange(len(lines) + 1)
    lines.insert(first, f"code: {code}")
    lines.insert(rng.randint(first + 1, len(lines)), f"next: {following}")
    return "".join(f"{line}\n" for line in lines).encode()


def _file_names(rng: random.Random, count: int) -> list[str]:
    names: set[str] = set()
    while len(names) < count:
        names.add(f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}.txt")
    return rng.sample(sorted(names), count)


def build_follow_clues(rng: random.Random, difficulty: int) -> Blueprint:
    length, decoys = TRAIL_LENGTHS[difficulty], DECOYS[difficulty]
    names = _file_names(rng, length + decoys)
    trail, off_trail = names[:length], names[length:]
    codes = [rng.choice(NOUNS) for _ in names]
    files: dict[str, bytes] = {}
    for index, name in enumerate(trail):
        following = trail[index + 1] if index + 1 < length else "none"
        files[f"clues/{name}"] = _clue_file(rng, codes[index], following)
    for index, name in enumerate(off_trail):
        # A decoy leads into the trail past its start: following one gives a wrong answer.
        files[f"clues/{name}"] = _clue_file(rng, codes[length + index],
                                            rng.choice(trail[1:]))
    answer = " ".join(codes[:length])
    instruction = (
        f"The folder `{CLUES}` holds clue files. Start with `{CLUES}/{trail[0]}`. Every clue file "
        "has a line `code: WORD` and a line `next: FILE` naming the next clue file of the trail "
        f"(in `{CLUES}`); the last clue says `next: none`. Other files in the folder are not on "
        f"the trail. Write the codes of the trail, in the order you find them, separated by "
        f"spaces, to `{ANSWER}`.\n")
    # The oracle follows the links with sed; a reading agent needs one look per clue.
    solution = (f"cd {CLUES}", f"f={trail[0]}; codes=''",
                "while [ \"$f\" != none ]; do codes=\"$codes $(sed -n 's/^code: //p' \"$f\")\"; "
                "f=$(sed -n 's/^next: //p' \"$f\"); done",
                f"echo $codes > {ANSWER}")
    steps = tuple(
        Step(commands=(f"clear; cat {CLUES}/{name}",),
             finding=f"clue {index + 1} ({name}): code {codes[index]}, next "
                     f"{trail[index + 1] if index + 1 < length else 'none'}",
             carry=f"clue {index + 1} code {codes[index]}")
        for index, name in enumerate(trail))
    steps += (Step(commands=(f"echo {answer} > {ANSWER}",),
                   finding=f"wrote the {length} codes to {ANSWER}", carry="answer written"),)
    return Blueprint(instruction=instruction, checks=check_answer(ANSWER, answer.replace(" ", "")),
                     solution=solution, files=files, steps=steps,
                     plan=f"Read each clue with cat, note its code and next file, then write "
                          f"the codes to {ANSWER}.")


FAMILIES = (
    Family("follow-clues", "Follow a trail of clue files longer than the context and write "
                           "its codes in order.",
           (f"{TRAIL_LENGTHS[1]} clues: fits in a 2,048-token context",
            f"{TRAIL_LENGTHS[2]} clues: more than the context holds",
            f"{TRAIL_LENGTHS[3]} clues"),
           build_follow_clues, category="long-horizon"),
)
