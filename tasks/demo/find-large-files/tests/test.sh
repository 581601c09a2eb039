#!/bin/bash
# Writes /logs/verifier/reward.json with components:
#   file_exists, recall, precision, sorted_ok, format_ok, and reward (1.0 only if all are 1.0).
mkdir -p /logs/verifier
echo '{"reward": 0.0}' > /logs/verifier/reward.json

python3 - <<'PY'
import json, os

EXPECTED = [".hidden_big", "Zeta.md", "a/report.log", "b/c/archive.dat", "b/just_over.txt"]
scores = {"file_exists": 0.0, "recall": 0.0, "precision": 0.0, "sorted_ok": 0.0, "format_ok": 0.0}
path = "/app/large_files.txt"

if os.path.isfile(path):
    scores["file_exists"] = 1.0
    with open(path, "rb") as fh:
        raw = fh.read()
    text = raw.decode("utf-8", errors="replace")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    # Well formed: non-empty output, newline-terminated, no blank lines, no stray spaces or "./".
    if (raw.endswith(b"\n") and lines and all(l and l == l.strip() for l in lines)
            and not any(l.startswith(("./", "/")) for l in lines)):
        scores["format_ok"] = 1.0
    listed = set(lines)
    hits = len(listed & set(EXPECTED))
    scores["recall"] = round(hits / len(EXPECTED), 4)
    scores["precision"] = round(hits / len(listed), 4) if listed else 0.0
    if lines == sorted(lines, key=lambda s: s.encode()) and len(lines) == len(listed):
        scores["sorted_ok"] = 1.0 if lines else 0.0

scores["reward"] = 1.0 if all(v == 1.0 for v in scores.values()) else 0.0
print(scores)
with open("/logs/verifier/reward.json", "w") as fh:
    json.dump(scores, fh)
PY
