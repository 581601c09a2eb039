#!/bin/bash
# Writes /logs/verifier/reward.json with components:
#   file_exists, header_ok, rows_ok (fraction of expected rows present), order_ok, no_extra_rows, and reward.
mkdir -p /logs/verifier
echo '{"reward": 0.0}' > /logs/verifier/reward.json

python3 - <<'PY'
import csv, json, os

EXPECTED = [
    ["2", "Omar Haddad", "omar@example.com"],
    ["9", "Lee, Ana", "ana.lee@example.com"],
    ["17", "Priya Nair", "priya@example.com"],
    ["23", "Marta Silva", "marta@example.com"],
    ["30", 'Jonas "JJ" Berg', "jonas@example.com"],
]
scores = {"file_exists": 0.0, "header_ok": 0.0, "rows_ok": 0.0, "order_ok": 0.0, "no_extra_rows": 0.0}
path = "/app/active_users.csv"

if os.path.isfile(path):
    scores["file_exists"] = 1.0
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            rows = [r for r in csv.reader(fh) if r]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        print("cannot parse CSV:", exc)
        rows = []
    if rows:
        if rows[0] == ["id", "name", "email"]:
            scores["header_ok"] = 1.0
        body = rows[1:]
        scores["rows_ok"] = round(sum(1 for r in EXPECTED if r in body) / len(EXPECTED), 4)
        if body == EXPECTED:
            scores["order_ok"] = 1.0
        if len(body) == len(EXPECTED) and all(r in EXPECTED for r in body):
            scores["no_extra_rows"] = 1.0

scores["reward"] = 1.0 if all(v == 1.0 for v in scores.values()) else 0.0
print(scores)
with open("/logs/verifier/reward.json", "w") as fh:
    json.dump(scores, fh)
PY
