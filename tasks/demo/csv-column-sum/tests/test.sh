#!/bin/bash
# Writes /logs/verifier/reward.json with components:
#   file_exists, format_ok, value_correct, input_unchanged, and reward (1.0 only if all pass).
mkdir -p /logs/verifier
echo '{"reward": 0.0}' > /logs/verifier/reward.json

python3 - <<'PY'
import hashlib, json, os, re

EXPECTED = 192
# sha256 of the original orders.csv, to make sure the input was left alone
INPUT_SHA = "013de8ed9d25bbb54204d59f66bb4dbe6874f26a3c31724fce1970d5aa8a6595"

out = "/app/units_total.txt"
scores = {"file_exists": 0.0, "format_ok": 0.0, "value_correct": 0.0, "input_unchanged": 0.0}

try:
    with open("/app/orders.csv", "rb") as fh:
        if hashlib.sha256(fh.read()).hexdigest() == INPUT_SHA:
            scores["input_unchanged"] = 1.0
except OSError:
    pass

if os.path.isfile(out):
    scores["file_exists"] = 1.0
    with open(out, encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    if re.fullmatch(r"[0-9]+\n?", text):
        scores["format_ok"] = 1.0
    digits = text.strip()
    if digits.isdigit() and int(digits) == EXPECTED:
        scores["value_correct"] = 1.0

scores["reward"] = 1.0 if all(v == 1.0 for v in scores.values()) else 0.0
print(scores)
with open("/logs/verifier/reward.json", "w") as fh:
    json.dump(scores, fh)
PY
