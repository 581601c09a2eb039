#!/bin/bash
# Image build step of every SWE-bench-format task: leaves /testbed at its checked-out commit with
# no git history past it, so an agent cannot read the fix from the repository.
#   prepare_testbed.sh                       /testbed comes with the image (SWE-bench images)
#   prepare_testbed.sh --import STREAM SHA   build /testbed from a git fast-import stream at SHA
# What goes: every remote, every ref (branch, tag, stash, note) whose commit is not an ancestor
# of HEAD, the reflogs, borrowed object stores, and then every object nothing kept can reach.
# The build fails unless `git rev-list --all` is HEAD's history and nothing is unreachable.
set -euo pipefail

if [ "${1:-}" = --import ]; then
  stream=$2 commit=$3
  git init -q -b main /testbed
  git -C /testbed fast-import --quiet < "$stream"
  git -C /testbed checkout -q -f -B main "$commit"
  rm -f "$stream"  # it holds the future commits too
fi
if ! git -C /testbed rev-parse --git-dir >/dev/null 2>&1; then
  echo "error: /testbed is not a git checkout: this task runs on its SWE-bench instance image," \
       "use --sandbox docker with that image in the engine" >&2
  exit 1
fi
cd /testbed
git config --global --add safe.directory /testbed
head=$(git rev-parse HEAD)
branch=$(git symbolic-ref -q HEAD || true)

for remote in $(git remote); do git remote remove "$remote"; done
git for-each-ref --format='%(refname)' | while read -r ref; do
  [ "$ref" = "$branch" ] && continue
  target=$(git rev-parse -q --verify "$ref^{commit}" || true)
  if [ -z "$target" ] || ! git merge-base --is-ancestor "$target" "$head"; then
    git update-ref -d "$ref"
  fi
done
gitdir=$(git rev-parse --git-dir)
rm -f "$gitdir"/{ORIG_HEAD,FETCH_HEAD,MERGE_HEAD,CHERRY_PICK_HEAD,REVERT_HEAD,AUTO_MERGE}
if [ -s "$gitdir/objects/info/alternates" ]; then
  git repack -a -d -q  # copy what HEAD needs before the borrowed store goes
  rm -f "$gitdir/objects/info/alternates"
fi
git reflog expire --expire=now --all
git gc --prune=now --quiet

if [ -n "$(git rev-list --all --not "$head")" ]; then
  echo "error: commits past $head are still reachable in /testbed" >&2; exit 1
fi
if [ -n "$(git fsck --unreachable --no-reflogs --no-progress 2>/dev/null)" ]; then
  echo "error: unreachable objects are left in /testbed" >&2; exit 1
fi
mkdir -p /skyrl/swe
echo "$head" > /skyrl/swe/head
