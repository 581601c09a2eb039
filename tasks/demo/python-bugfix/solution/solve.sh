#!/bin/bash
set -euo pipefail
# The even-length case of median() must average the two middle values.
python3 - <<'PY'
path = "/app/mathlib.py"
src = open(path).read()
old = "    mid = len(ordered) // 2\n    return ordered[mid]\n"
new = ("    mid = len(ordered) // 2\n"
       "    if len(ordered) % 2 == 0:\n"
       "        return (ordered[mid - 1] + ordered[mid]) / 2\n"
       "    return ordered[mid]\n")
assert old in src, "unexpected mathlib.py content"
open(path, "w").write(src.replace(old, new))
PY
