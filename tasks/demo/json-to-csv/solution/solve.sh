#!/bin/bash
set -euo pipefail
python3 - <<'PY'
import csv, json
with open("/app/users.json", encoding="utf-8") as fh:
    users = json.load(fh)
active = sorted((u for u in users if u["active"] is True), key=lambda u: u["id"])
with open("/app/active_users.csv", "w", newline="", encoding="utf-8") as fh:
    w = csv.writer(fh)
    w.writerow(["id", "name", "email"])
    for u in active:
        w.writerow([u["id"], u["name"], u["email"]])
PY
