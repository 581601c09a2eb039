"""Word pools the families draw names and contents from: lowercase ASCII letters only, so no
shell quoting, locale collation or sed escaping can change what a command does with them."""

from __future__ import annotations

import random

NOUNS = (
    "apple", "badge", "cabin", "daisy", "eagle", "fern", "garden", "harbor", "island", "jacket",
    "kettle", "lemon", "meadow", "needle", "orchard", "pebble", "quilt", "river", "saddle",
    "tiger", "umbrella", "valley", "walnut", "yarn", "zebra", "anchor", "basket", "candle",
    "desert", "engine", "forest", "glacier", "helmet", "igloo", "jungle", "kite", "lantern",
    "mirror", "nest", "otter", "parrot", "rocket", "sparrow", "tunnel", "violin", "window",
)
ADJECTIVES = (
    "amber", "brave", "calm", "dusty", "eager", "fuzzy", "gentle", "happy", "icy", "jolly",
    "kind", "lucky", "misty", "noble", "odd", "proud", "quiet", "rapid", "shiny", "tidy",
    "vivid", "warm", "young", "zesty", "bold", "crisp", "dark", "early", "fresh", "grand",
)
FILE_STEMS = (
    "notes", "report", "inventory", "todo", "guests", "plants", "songs", "books", "tools",
    "recipes", "colors", "cities", "animals", "tasks", "memo", "journal", "list", "catalog",
    "ledger", "roster", "agenda", "draft", "summary", "records",
)
FOLDERS = ("docs", "data", "config", "archive", "work", "drafts", "logs", "share")
PEOPLE = (("Ada Lane", "ada@example.org"), ("Bo Chen", "bo@example.org"),
          ("Cleo Park", "cleo@example.org"), ("Dev Rao", "dev@example.org"),
          ("Eli Moss", "eli@example.org"), ("Fay Ortiz", "fay@example.org"))


def phrase(rng: random.Random, words: int) -> str:
    """`words` words: adjectives then a noun (e.g. `quiet amber river`)."""
    return " ".join([*rng.sample(ADJECTIVES, words - 1), rng.choice(NOUNS)])


def distinct(rng: random.Random, pool: tuple[str, ...], count: int,
             avoid: tuple[str, ...] = ()) -> list[str]:
    """`count` different words of `pool`, none of `avoid` and none containing another as a
    substring (so a replacement or a word search never matches inside another word)."""
    chosen: list[str] = []
    for word in rng.sample(pool, len(pool)):
        taken = [*chosen, *avoid]
        if any(word in other or other in word for other in taken):
            continue
        chosen.append(word)
        if len(chosen) == count:
            return chosen
    raise ValueError(f"the pool has no {count} words apart from each other")
