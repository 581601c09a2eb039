#!/usr/bin/env bash
# Sets up and runs the gates (ruff, mypy, the docs) and every test tier: unit, slow, vLLM (its
# venv built here) and Docker (engine started here when possible). Extra arguments go to pytest, e.g.
# scripts/test.sh -m "not docker".
# Tests run in SKYRL_AGENT_TEST_WORKERS parallel workers (default 2: most of a test's time is
# spent waiting on sandboxes, servers and Docker, so two overlap well even on 2 cores); a test
# file stays on one worker (its module fixtures start once) and tests marked `serial` run alone.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --dev || exit $?
.venv/bin/ruff check skyrl_agent tests benchmarks scripts || exit 1
# The type check runs while vLLM is set up, with its cache kept per checkout in the user's cache
# (a checkout tested again re-checks only what changed: ~5 s instead of ~2 minutes).
cache="${SKYRL_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/skyrl-agent}"
mypy_log=$(mktemp)
.venv/bin/mypy --cache-dir "$cache/mypy/$(pwd | sha256sum | cut -c1-16)" >"$mypy_log" 2>&1 &
mypy_pid=$!
bash scripts/setup-vllm.sh || { status=$?; kill "$mypy_pid" 2>/dev/null; rm -f "$mypy_log"; exit $status; }
export SKYRL_AGENT_REQUIRE_VLLM=1   # the vLLM tier must run, not skip
wait $mypy_pid || { cat "$mypy_log"; rm -f "$mypy_log"; exit 1; }
tail -n 1 "$mypy_log"; rm -f "$mypy_log"
# The docs: reference pages as the code generates them, and the site built with --strict (a
# broken link or a page left out of the navigation fails).
.venv/bin/python scripts/docs_reference.py --check || exit 1
site=$(mktemp -d)
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict -q -d "$site" || { rm -rf "$site"; exit 1; }
rm -rf "$site"

started=""
if [ "$(id -u)" = 0 ] && command -v dockerd >/dev/null; then
  state=$(bash scripts/docker-engine.sh start) || exit 1
  [ "$state" = started ] && started=1
  bash scripts/build-base-image.sh || { [ -n "$started" ] && bash scripts/docker-engine.sh stop; exit 1; }
  export SKYRL_AGENT_REQUIRE_DOCKER=1   # the Docker tier must run, not skip
fi

workers="${SKYRL_AGENT_TEST_WORKERS:-2}"
# --durations lists the slowest tests: the suite must stay under 30 minutes on 2 cores.
.venv/bin/python -m pytest -q -p no:cacheprovider -n "$workers" --dist loadfile --durations=25 "$@"
status=$?
# Tests must leave no local sandbox behind (no folder, no mounted disk, no cgroup), and no
# trainer's shared-memory weights file.
left=$(find "${TMPDIR:-/tmp}/skyrl-agent-sandboxes" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
mounted=$(grep -c skyrl-agent-sandboxes /proc/mounts || true)
cgroups=$(find /sys/fs/cgroup/*/skyrl-agent -mindepth 1 -maxdepth 1 -type d 2>/dev/null | wc -l)
weights=$(find /dev/shm -maxdepth 1 -name 'skyrl-agent-weights-*' 2>/dev/null | wc -l)
if [ "$left" != 0 ] || [ "$mounted" != 0 ] || [ "$cgroups" != 0 ] || [ "$weights" != 0 ]; then
  echo "error: the tests left $left local sandbox folders, $mounted mounted sandbox disks," \
       "$cgroups sandbox cgroups and $weights shared-memory weights files" >&2
  [ $status = 0 ] && status=1
fi
[ -n "$started" ] && bash scripts/docker-engine.sh stop
exit $status
