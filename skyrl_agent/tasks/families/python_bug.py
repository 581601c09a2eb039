"""Fix a one-line bug in a small Python module so its hidden checks pass.

The agent's module is never run as ordinary code by the verifier: the checker (tests/check.py)
parses it, accepts only a small set of syntax (no imports, attributes, dunder names or calls
outside a few builtins) and runs that in a namespace holding only those builtins. So a module
cannot write the reward file, start a process or read the checker's expected values.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from skyrl_agent.tasks.families.base import Blueprint, Family
from skyrl_agent.tasks.families.words import FILE_STEMS


@dataclass(frozen=True)
class Function:
    """One function of the pool: its code, the bug planted in it, and how to check it."""

    name: str
    params: str
    doc: str
    correct: str
    """The body line (after `return `) that does what the docstring says."""
    buggy: str
    """The same line with the bug."""
    reference: Callable[..., Any]
    cases: Callable[[random.Random], list[tuple[Any, ...]]]
    example: tuple[Any, ...]

    def source(self, body: str) -> str:
        return f'def {self.name}({self.params}):\n    """{self.doc}"""\n    return {body}\n'


def _ints(rng: random.Random, count: int, low: int, high: int) -> list[int]:
    return [rng.randint(low, high) for _ in range(count)]


POOL = (
    Function("page_count", "total, per_page",
             "How many pages of per_page items hold total items; a partly filled last page "
             "counts.", "(total + per_page - 1) // per_page", "total // per_page",
             lambda t, p: (t + p - 1) // p,
             lambda r: [(r.randint(0, 60), r.randint(1, 9)) for _ in range(12)] + [(7, 3)],
             (7, 3)),
    Function("last_index", "items", "The index of the last element of a non-empty list.",
             "len(items) - 1", "len(items)", lambda items: len(items) - 1,
             lambda r: [(_ints(r, r.randint(1, 8), 0, 9),) for _ in range(8)], ([4, 5, 6],)),
    Function("clamp", "value, low, high", "value limited to the range low..high.",
             "max(low, min(value, high))", "max(low, min(value, low))",
             lambda v, lo, hi: max(lo, min(v, hi)),
             lambda r: [(r.randint(-20, 40), 0, r.randint(5, 20)) for _ in range(12)],
             (15, 0, 10)),
    Function("average", "values", "The arithmetic mean of a non-empty list of numbers.",
             "sum(values) / len(values)", "sum(values) / (len(values) + 1)",
             lambda values: sum(values) / len(values),
             lambda r: [(_ints(r, r.randint(1, 6), 0, 50),) for _ in range(8)], ([2, 4, 9],)),
    Function("is_even", "number", "True when number is even.", "number % 2 == 0",
             "number % 2 == 1", lambda n: n % 2 == 0,
             lambda r: [(r.randint(-50, 50),) for _ in range(12)] + [(0,), (1,)], (4,)),
    Function("middle", "items", "The middle element of a list of odd length.",
             "items[len(items) // 2]", "items[len(items) // 2 + 1]",
             lambda items: items[len(items) // 2],
             lambda r: [(_ints(r, 2 * r.randint(0, 4) + 1, 0, 99),) for _ in range(8)],
             ([3, 8, 1],)),
    Function("to_fahrenheit", "celsius", "The temperature celsius in degrees Fahrenheit.",
             "celsius * 9 / 5 + 32", "celsius * 9 / 5 - 32", lambda c: c * 9 / 5 + 32,
             lambda r: [(r.randint(-40, 100),) for _ in range(10)], (100,)),
    Function("count_above", "values, limit", "How many of values are strictly greater than "
             "limit.", "len([v for v in values if v > limit])",
             "len([v for v in values if v >= limit])",
             lambda values, limit: len([v for v in values if v > limit]),
             lambda r: [(vals := _ints(r, r.randint(2, 8), 0, 9), r.choice(vals))
                        for _ in range(10)], ([1, 5, 7, 5], 5)),
    Function("distance", "a, b", "How far apart the numbers a and b are (never negative).",
             "abs(a - b)", "abs(a + b)", lambda a, b: abs(a - b),
             lambda r: [(r.randint(-30, 30), r.randint(-30, 30)) for _ in range(12)], (3, 10)),
    Function("percent", "part, whole", "part as a percentage of whole.",
             "part * 100 / whole", "part * 10 / whole", lambda p, w: p * 100 / w,
             lambda r: [(r.randint(0, 50), r.randint(1, 50)) for _ in range(10)], (1, 4)),
)


def sed_replace(old: str, new: str) -> str:
    """A sed expression replacing the whole line `old` by `new` (delimiter `|`)."""
    pattern = "".join(f"\\{c}" if c in ".*[]^$\\" else c for c in old)
    replacement = "".join(f"\\{c}" if c in "\\&" else c for c in new)
    return f"s|^{pattern}$|{replacement}|"


def _call(function: Function, args: tuple[Any, ...]) -> str:
    return f"{function.name}({', '.join(repr(a) for a in args)})"


def build_bug(rng: random.Random, difficulty: int) -> Blueprint:
    count = {1: 1, 2: rng.randint(2, 3), 3: rng.randint(3, 4)}[difficulty]
    chosen = rng.sample(POOL, count)
    broken = rng.choice(chosen)
    module = f"{rng.choice(FILE_STEMS)}_utils"
    path = f"/app/{module}.py"
    source = "\n\n".join(f.source(f.buggy if f is broken else f.correct) for f in chosen)
    cases = [{"function": f.name, "args": list(args), "want": f.reference(*args)}
             for f in chosen for args in f.cases(rng)]
    want = broken.reference(*broken.example)
    if difficulty == 3:
        instruction = (f"One function in `{path}` has a bug on one line: it does not do what its "
                       "docstring says. Find it and fix that line in place.")
    else:
        instruction = (f"The function `{broken.name}` in `{path}` has a bug on one line. Its "
                       f"docstring says what it should return: \"{broken.doc}\" For example, "
                       f"`{_call(broken, broken.example)}` must return `{want!r}`. Fix that "
                       "line in place.")
    instruction += (" Keep every function's name and parameters, and use no imports.\n")
    old, new = f"    return {broken.buggy}", f"    return {broken.correct}"
    return Blueprint(
        instruction=instruction,
        checks=(f"out=$(timeout 30 python3 -I -S /tests/check.py {path} 2>&1)\n"
                'echo "$out"\n'
                '[ "$(printf \'%s\\n\' "$out" | tail -n 1)" = "ALL CHECKS PASSED" ] '
                f'|| fail "{module}.py does not pass its checks"'),
        solution=(f"sed -i '{sed_replace(old, new)}' {path}",),
        plan=f"Fix the wrong line of {broken.name} with sed.",
        files={f"{module}.py": f'"""Small helpers."""\n\n\n{source}'.encode()},
        test_files={"check.py": CHECKER.replace("CASES_JSON", json.dumps(cases)).encode()})


CHECKER = r'''"""Checks a module's functions on hidden cases without running it as ordinary code."""
import ast
import json
import math
import os
import stat
import sys

CASES = json.loads(r"""CASES_JSON""")
BUILTINS = {"len": len, "range": range, "min": min, "max": max, "abs": abs, "sum": sum,
            "sorted": sorted, "list": list, "int": int, "float": float, "round": round}
ALLOWED = (ast.Module, ast.FunctionDef, ast.arguments, ast.arg, ast.Return, ast.Expr, ast.If,
           ast.IfExp, ast.Assign, ast.AugAssign, ast.For, ast.Compare, ast.BoolOp, ast.BinOp,
           ast.UnaryOp, ast.Name, ast.Load, ast.Store, ast.Constant, ast.Call, ast.Subscript,
           ast.Slice, ast.List, ast.Tuple, ast.ListComp, ast.comprehension, ast.operator,
           ast.cmpop, ast.boolop, ast.unaryop, ast.expr_context)


def refuse(why):
    print(why)
    print("CHECKS FAILED")
    sys.exit(0)


def load(path):
    try:
        info = os.lstat(path)
    except OSError:
        refuse(f"{path} is missing")
    if not stat.S_ISREG(info.st_mode) or info.st_size > 65536:
        refuse(f"{path} is not a regular file of at most 64 KiB")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as handle:
        text = handle.read().decode("utf-8", "replace")
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        refuse(f"syntax error: {exc}")
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    for node in ast.walk(tree):
        line = getattr(node, "lineno", "?")
        if not isinstance(node, ALLOWED):
            refuse(f"line {line}: {type(node).__name__} is not allowed here")
        names = [node.id] if isinstance(node, ast.Name) else [node.arg] \
            if isinstance(node, ast.arg) else [node.name] if isinstance(node, ast.FunctionDef) \
            else []
        if any(name.startswith("_") for name in names):
            refuse(f"line {line}: names may not start with _")
        if isinstance(node, ast.FunctionDef) and (node.decorator_list or node.returns):
            refuse(f"line {line}: no decorators or annotations")
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and (
                node.func.id in BUILTINS or node.func.id in defined)):
            refuse(f"line {line}: only {', '.join(sorted(BUILTINS))} may be called")
    namespace = {"__builtins__": dict(BUILTINS)}
    exec(compile(tree, path, "exec"), namespace)
    return namespace


def same(got, want):
    if isinstance(want, float) or isinstance(got, float):
        return isinstance(got, (int, float)) and not isinstance(got, bool) and \
            math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9)
    return type(got) is type(want) and got == want


def main(path):
    namespace = load(path)
    failed = 0
    for case in CASES:
        function = namespace.get(case["function"])
        if not callable(function):
            refuse(f"{case['function']} is missing")
        try:
            got = function(*case["args"])
        except Exception as exc:
            got = f"raised {type(exc).__name__}"
        if not same(got, case["want"]):
            failed += 1
    if failed:
        refuse(f"{failed} of {len(CASES)} checks failed")
    print("ALL CHECKS PASSED")


main(sys.argv[1])
'''

FAMILIES = (
    Family("fix-bug", "Fix a one-line bug in a Python module so its hidden checks pass.",
           ("one function, named", "two or three functions, the broken one named",
            "three or four functions, the broken one not named"), build_bug,
           category="python"),
)
