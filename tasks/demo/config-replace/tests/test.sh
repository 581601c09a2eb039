#!/bin/bash
# Reward 1 only if /app/conf matches /tests/expected/conf exactly (same files, same contents).
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt

python3 - <<'PY'
import os, sys

def snapshot(root):
    files = {}
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            full = os.path.join(dirpath, n)
            with open(full, "rb") as fh:
                files[os.path.relpath(full, root)] = fh.read()
    return files

if not os.path.isdir("/app/conf"):
    sys.exit("missing /app/conf")
want, got = snapshot("/tests/expected/conf"), snapshot("/app/conf")
ok = True
for name in sorted(set(want) | set(got)):
    if name not in got:
        print("missing file:", name); ok = False
    elif name not in want:
        print("unexpected file:", name); ok = False
    elif got[name] != want[name]:
        print("wrong content:", name); ok = False
if not ok:
    sys.exit(1)
print("configuration files are correct")
PY
if [ $? -eq 0 ]; then
    echo 1 > /logs/verifier/reward.txt
fi
