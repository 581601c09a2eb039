#!/bin/bash
# Writes /logs/verifier/reward.json with components:
#   repo_exists, single_commit, message_ok, author_ok, files_tracked, tree_clean, and reward.
mkdir -p /logs/verifier
echo '{"reward": 0.0}' > /logs/verifier/reward.json

P=/app/project
# git reads a snapshot of the agent's .git and runs nothing it names (see gitcheck.sh).
. /tests/gitcheck.sh

repo_exists=0; single_commit=0; message_ok=0; author_ok=0; files_tracked=0; tree_clean=0

if git_snapshot "$P/.git"; then
    repo_exists=1
    [ "$(gitc rev-list --count HEAD)" = "1" ] && single_commit=1
    log() { gitc log -1 --no-ext-diff --no-textconv "$@" HEAD; }
    [ "$(log --format=%B | sed -e '/^$/d')" = "Initial import" ] && message_ok=1
    [ "$(log --format='%an <%ae>')" = "Robin Example <robin@example.org>" ] && author_ok=1
    expected=$'README.md\ndocs/usage.txt\ntempconv.py'
    [ "$(gitc ls-tree -r --name-only HEAD | LC_ALL=C sort)" = "$expected" ] && files_tracked=1
    status=$(gitc --work-tree="$P" status --porcelain --untracked-files=all \
             --ignore-submodules=all; echo "rc=$?")
    [ "$status" = "rc=0" ] && tree_clean=1
fi

python3 - "$repo_exists" "$single_commit" "$message_ok" "$author_ok" "$files_tracked" "$tree_clean" <<'PY'
import json, sys
names = ["repo_exists", "single_commit", "message_ok", "author_ok", "files_tracked", "tree_clean"]
scores = {n: float(v) for n, v in zip(names, sys.argv[1:])}
scores["reward"] = 1.0 if all(v == 1.0 for v in scores.values()) else 0.0
print(scores)
with open("/logs/verifier/reward.json", "w") as fh:
    json.dump(scores, fh)
PY
