"""The repos of the swe-mini set (scripts/make_swe_mini.py turns them into instances).

Three tiny Python packages with pytest suites, two real bugs each. A repo is its commits in
order; an instance names the commit it starts from (`base`) and the commit that fixed its bug
(`fix`, source and tests together, as a merged pull request). Later commits, tags and branches
are the future an agent must not be able to read.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Commit:
    message: str
    files: dict[str, str | None]
    """Path -> new content (None deletes it)."""
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class Instance:
    number: int
    base: int
    """Index of the commit the agent starts from."""
    fix: int
    """Index of the commit that fixed the bug."""
    issue: str


@dataclass(frozen=True)
class Repo:
    name: str
    version: str
    commits: list[Commit]
    instances: list[Instance]
    branches: dict[str, int] = field(default_factory=dict)


IGNORE = "__pycache__/\n*.pyc\n.pytest_cache/\n"

WRAP_BUGGY = '''"""Word wrapping."""


def wrap(text: str, width: int) -> list[str]:
    """Greedy word wrap: lines of at most `width` characters (a longer word gets a line of its
    own)."""
    if width < 1:
        raise ValueError("width must be positive")
    lines: list[str] = []
    current = ""
    for word in text.split():
        if current and len(current) + 1 + len(word) >= width:
            lines.append(current)
            current = word
        else:
            current = f"{current} {word}" if current else word
    if current:
        lines.append(current)
    return lines
'''
WRAP_TESTS = '''import pytest

from textkit.wrap import wrap


def test_empty_text():
    assert wrap("", 10) == []


def test_short_text_is_one_line():
    assert wrap("one two", 20) == ["one two"]


def test_long_word_gets_its_own_line():
    assert wrap("a verylongword b", 4) == ["a", "verylongword", "b"]


def test_width_must_be_positive():
    with pytest.raises(ValueError):
        wrap("x", 0)
'''
WRAP_NEW_TESTS = '''

def test_line_that_fits_exactly_is_kept():
    assert wrap("aaa bbb", 7) == ["aaa bbb"]


def test_every_line_is_filled():
    assert wrap("the quick brown fox", 9) == ["the quick", "brown fox"]
'''
SLUG_BUGGY = '''"""URL slugs."""

import re


def slugify(text: str) -> str:
    """Lower-case words joined by single dashes: "Hello, World!" -> "hello-world"."""
    return re.sub(r"[^a-z0-9]", "-", text.lower())
'''
SLUG_TESTS = '''from textkit.slug import slugify


def test_single_word():
    assert slugify("Python") == "python"


def test_two_words():
    assert slugify("two words") == "two-words"


def test_digits_are_kept():
    assert slugify("route 66") == "route-66"
'''
SLUG_NEW_TESTS = '''

def test_punctuation_collapses_to_one_dash():
    assert slugify("Hello, World!") == "hello-world"


def test_edges_are_trimmed():
    assert slugify("  spaced out  ") == "spaced-out"
'''
TEXTKIT = Repo("swe-mini/textkit", "0.1", [
    Commit("Start textkit: greedy word wrapping", {
        ".gitignore": IGNORE, "README.md": "# textkit\n\nSmall text helpers.\n",
        "textkit/__init__.py": '"""Small text helpers."""\n',
        "textkit/wrap.py": WRAP_BUGGY, "tests/test_wrap.py": WRAP_TESTS}),
    Commit("Add slugify", {"textkit/slug.py": SLUG_BUGGY, "tests/test_slug.py": SLUG_TESTS}),
    Commit("Fix wrap splitting lines that fit the width exactly (#1)", {
        "textkit/wrap.py": WRAP_BUGGY.replace(">= width", "> width"),
        "tests/test_wrap.py": WRAP_TESTS + WRAP_NEW_TESTS}),
    Commit("Fix slugify leaving repeated and trailing dashes (#2)", {
        "textkit/slug.py": SLUG_BUGGY.replace(
            're.sub(r"[^a-z0-9]", "-", text.lower())',
            're.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")'),
        "tests/test_slug.py": SLUG_TESTS + SLUG_NEW_TESTS}),
    Commit("Add truncate", {"textkit/truncate.py": (
        '"""Truncation."""\n\n\ndef truncate(text: str, size: int) -> str:\n'
        '    return text if len(text) <= size else text[: max(0, size - 1)] + "~"\n')},
        tags=("v0.2.0",)),
], [
    Instance(1, base=1, fix=2, issue=(
        "wrap() splits a line that fits the width exactly\n\n"
        "`textkit.wrap.wrap` promises lines of at most `width` characters, but a line of "
        "exactly `width` characters is split in two:\n\n"
        "```python\n>>> wrap('aaa bbb', 7)\n['aaa', 'bbb']\n```\n\n"
        "I expected `['aaa bbb']`. The same happens in longer texts: every line comes out "
        "one word shorter than it could be.\n")),
    Instance(2, base=2, fix=3, issue=(
        "slugify() leaves double and trailing dashes\n\n"
        "```python\n>>> slugify('Hello, World!')\n'hello--world-'\n```\n\n"
        "A slug should be lower-case words joined by single dashes, with no dash at either "
        "end: `'hello-world'`. Leading and trailing spaces have the same problem.\n")),
], branches={"next": 4})

PARSE_BUGGY = '''"""Parsing "1h30m"-style durations."""

import re

_UNITS = {"h": 3600, "m": 60, "s": 1}
_PART = re.compile(r"(\\d+)([hms])")


def parse_duration(text: str) -> int:
    """Seconds in a duration such as "45s", "1h30m" or "2h5m10s"."""
    text = text.strip()
    match = _PART.match(text)
    if not match or _PART.sub("", text):
        raise ValueError(f"not a duration: {text!r}")
    return int(match.group(1)) * _UNITS[match.group(2)]
'''
PARSE_TESTS = '''import pytest

from durations.parse import parse_duration


def test_seconds():
    assert parse_duration("45s") == 45


def test_hours():
    assert parse_duration("2h") == 7200


@pytest.mark.parametrize("text", ["abc", "10x", "5", "h"])
def test_rejects_what_is_not_a_duration(text):
    with pytest.raises(ValueError):
        parse_duration(text)
'''
PARSE_NEW_TESTS = '''

def test_hours_and_minutes_add_up():
    assert parse_duration("1h30m") == 5400


def test_every_unit_counts():
    assert parse_duration("2h5m10s") == 7510
'''
FORMAT_BUGGY = '''"""Writing durations."""


def format_duration(seconds: int) -> str:
    """The shortest "1h2m5s"-style text for a whole number of seconds."""
    if seconds < 0:
        raise ValueError("negative duration")
    parts = []
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)
'''
FORMAT_TESTS = '''import pytest

from durations.format import format_duration


def test_all_units():
    assert format_duration(3725) == "1h2m5s"


def test_seconds_only():
    assert format_duration(59) == "59s"


def test_whole_hours():
    assert format_duration(7200) == "2h"


def test_negative_is_refused():
    with pytest.raises(ValueError):
        format_duration(-1)
'''
FORMAT_NEW_TESTS = '''

def test_zero_is_zero_seconds():
    assert format_duration(0) == "0s"


def test_zero_round_trips():
    from durations.parse import parse_duration

    assert parse_duration(format_duration(0)) == 0
'''
DURATIONS = Repo("swe-mini/durations", "1.0", [
    Commit("Parse durations", {
        ".gitignore": IGNORE, "README.md": "# durations\n\nParse and write 1h30m.\n",
        "durations/__init__.py": '"""Durations such as 1h30m."""\n',
        "durations/parse.py": PARSE_BUGGY, "tests/test_parse.py": PARSE_TESTS}),
    Commit("Add format_duration", {"durations/format.py": FORMAT_BUGGY,
                                   "tests/test_format.py": FORMAT_TESTS}),
    Commit("Count every unit of a duration, not only the first (#1)", {
        "durations/parse.py": PARSE_BUGGY.replace(
            "    return int(match.group(1)) * _UNITS[match.group(2)]\n",
            "    return sum(int(n) * _UNITS[unit] for n, unit in _PART.findall(text))\n"),
        "tests/test_parse.py": PARSE_TESTS + PARSE_NEW_TESTS}),
    Commit("Write zero as 0s (#2)", {
        "durations/format.py": FORMAT_BUGGY.replace('return "".join(parts)',
                                                    'return "".join(parts) or "0s"'),
        "tests/test_format.py": FORMAT_TESTS + FORMAT_NEW_TESTS}),
    Commit("Add a days unit", {"README.md": "# durations\n\nParse and write 1d2h30m.\n"},
           tags=("v1.1.0",)),
], [
    Instance(1, base=1, fix=2, issue=(
        "parse_duration ignores everything after the first unit\n\n"
        "```python\n>>> parse_duration('1h30m')\n3600\n```\n\n"
        "This should be 5400: the minutes are dropped. `2h5m10s` gives 7200 as well.\n")),
    Instance(2, base=2, fix=3, issue=(
        "format_duration(0) returns an empty string\n\n"
        "`format_duration(0)` gives `''`, which `parse_duration` then rejects, so a zero "
        "duration cannot be written and read back. It should be `'0s'`.\n")),
], branches={"next": 4})

LRU_BUGGY = '''"""A least-recently-used cache."""

from collections import OrderedDict


class LRUCache:
    """A mapping of at most `capacity` entries that forgets the least recently used one."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be positive")
        self.capacity = capacity
        self._data: OrderedDict = OrderedDict()

    def get(self, key, default=None):
        return self._data.get(key, default)

    def put(self, key, value) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        if len(self._data) > self.capacity:
            self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key) -> bool:
        return key in self._data
'''
LRU_FIXED = LRU_BUGGY.replace(
    "        return self._data.get(key, default)\n",
    "        if key not in self._data:\n            return default\n"
    "        self._data.move_to_end(key)\n        return self._data[key]\n")
LRU_TESTS = '''import pytest

from ministruct.lru import LRUCache


def test_put_then_get():
    cache = LRUCache(2)
    cache.put("a", 1)
    assert cache.get("a") == 1
    assert cache.get("missing", 0) == 0


def test_oldest_entry_is_evicted():
    cache = LRUCache(2)
    for key in "abc":
        cache.put(key, key)
    assert "a" not in cache and len(cache) == 2


def test_capacity_must_be_positive():
    with pytest.raises(ValueError):
        LRUCache(0)
'''
LRU_NEW_TESTS = '''

def test_get_makes_an_entry_recent():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1
    cache.put("c", 3)
    assert "a" in cache and "b" not in cache
'''
INTERVALS_BUGGY = '''"""Interval arithmetic."""


def merge_intervals(intervals):
    """Merge overlapping or touching closed intervals: [(1, 3), (3, 5)] -> [(1, 5)]."""
    merged = []
    for start, end in sorted(intervals):
        if merged and start < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged
'''
INTERVALS_TESTS = '''from ministruct.intervals import merge_intervals


def test_overlapping_intervals_merge():
    assert merge_intervals([(1, 4), (2, 6)]) == [(1, 6)]


def test_disjoint_intervals_stay():
    assert merge_intervals([(5, 6), (1, 2)]) == [(1, 2), (5, 6)]


def test_nothing_to_merge():
    assert merge_intervals([]) == []
'''
INTERVALS_NEW_TESTS = '''

def test_touching_intervals_merge():
    assert merge_intervals([(1, 3), (3, 5)]) == [(1, 5)]


def test_a_chain_of_touching_intervals_merges():
    assert merge_intervals([(3, 4), (1, 2), (2, 3)]) == [(1, 4)]
'''
MINISTRUCT = Repo("swe-mini/ministruct", "0.3", [
    Commit("Add an LRU cache", {
        ".gitignore": IGNORE, "README.md": "# ministruct\n\nSmall data structures.\n",
        "ministruct/__init__.py": '"""Small data structures."""\n',
        "ministruct/lru.py": LRU_BUGGY, "tests/test_lru.py": LRU_TESTS}),
    Commit("Add merge_intervals", {"ministruct/intervals.py": INTERVALS_BUGGY,
                                   "tests/test_intervals.py": INTERVALS_TESTS}),
    Commit("LRUCache.get marks the entry as recently used (#1)", {
        "ministruct/lru.py": LRU_FIXED, "tests/test_lru.py": LRU_TESTS + LRU_NEW_TESTS}),
    Commit("Merge touching intervals (#2)", {
        "ministruct/intervals.py": INTERVALS_BUGGY.replace(
            "start < merged[-1][1]", "start <= merged[-1][1]"),
        "tests/test_intervals.py": INTERVALS_TESTS + INTERVALS_NEW_TESTS}),
    Commit("Add LRU hit statistics", {"README.md": "# ministruct\n\nWith cache stats.\n"},
           tags=("v0.4.0",)),
], [
    Instance(1, base=1, fix=2, issue=(
        "LRUCache evicts an entry that was just read\n\n"
        "```python\ncache = LRUCache(2)\ncache.put('a', 1)\ncache.put('b', 2)\n"
        "cache.get('a')\ncache.put('c', 3)\n'a' in cache  # False, but 'a' was used last\n"
        "```\n\nReading an entry should make it the most recently used one, so `b` should "
        "go.\n")),
    Instance(2, base=2, fix=3, issue=(
        "merge_intervals does not merge touching intervals\n\n"
        "The docstring says `[(1, 3), (3, 5)]` becomes `[(1, 5)]`, but the result is "
        "`[(1, 3), (3, 5)]`. Closed intervals that share an end point should merge.\n")),
], branches={"next": 4})

REPOS = [TEXTKIT, DURATIONS, MINISTRUCT]
