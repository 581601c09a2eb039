"""Calls the agent's module on the hidden cases (cases.py) and prints what came back, as JSON.

judge.py runs this as an unprivileged user in a PID namespace of its own; it decides nothing.
The judge also uses `answer` on the reference solution, so both sides are recorded alike."""

import copy
import importlib
import json
import sys


def answer(module, function, args):
    """What one call did: its value, or the exception it raised; and whether it changed its
    arguments."""
    given = copy.deepcopy(list(args))
    try:
        value = getattr(module, function)(*given)
        result = {"value": value if isinstance(value, (int, float, str, list, type(None)))
                  else repr(value)}
    except Exception as exc:
        result = {"raised": type(exc).__name__}
    if given != list(args):
        result["mutated"] = True
    return result


def main():
    sys.path.insert(0, "/tests")
    import cases

    sys.path.insert(0, "/app")
    try:
        module = importlib.import_module(cases.MODULE)
    except BaseException as exc:
        print(json.dumps({"import_error": repr(exc)}))
        return
    print(json.dumps({name: answer(module, function, args)
                      for name, function, args in cases.CASES}))


if __name__ == "__main__":
    main()
