#!/usr/bin/env bash
# Mutation testing of the pure core modules against the fast unit tests (mutmut 3).
#
# What is mutated and which tests run are set in pyproject.toml, [tool.mutmut]:
#   only_mutate                          the core modules (one score line each below)
#   pytest_add_cli_args_test_selection   the fast unit-test files that cover them
#   pytest_add_cli_args                  -m "not slow and not docker and not gpu"
# mutmut copies the package and tests into mutants/ (git-ignored) and, per mutant, runs only the
# tests that reached the mutated function.
#
# Score per module and overall, as mutmut counts it: (killed + timeout) / (total - skipped).
# "no tests" mutants (code no selected test reaches) count against the score.
#
# Environment:
#   MUTATION_JOBS=N         parallel workers (default: the number of cores)
#   MUTATION_TIME_LIMIT=S   stop mutmut after S seconds; unchecked mutants are reported as such
#                           (mutmut runs the mutants with the fastest tests first)
#   MUTATION_MODULE_TIME_LIMIT=S   instead, one mutmut run per module, each stopped after S s
#                           (give each a few minutes: a run first runs the module's tests clean,
#                           and the first one also generates the mutants and collects coverage)
#   MUTATION_RESUME=1       keep mutants/ from an earlier run (mutmut resumes and re-tests only
#                           what changed) instead of starting fresh
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv
if ! "$VENV/bin/python" -c "import mutmut" 2>/dev/null; then
    echo "installing mutmut into $VENV" >&2
    "$VENV/bin/pip" install -q mutmut
fi

jobs="${MUTATION_JOBS:-$(nproc)}"
if [ "${MUTATION_RESUME:-0}" != 1 ]; then
    rm -rf mutants
fi
log="$(mktemp -t mutmut-run.XXXXXX.log)"
modules="$("$VENV/bin/python" -c '
import tomllib
with open("pyproject.toml", "rb") as f:
    print(" ".join(p.removesuffix(".py").replace("/", ".")
                   for p in tomllib.load(f)["tool"]["mutmut"]["only_mutate"]))')"

# mutmut_run LIMIT [mutant patterns...]: one run, stopped after LIMIT seconds if LIMIT is set.
# SIGINT is mutmut's own "stop now" (results so far are kept); one that does not stop within a
# minute (e.g. still running its clean tests) is killed. Sets $status.
mutmut_run() {
    local limit=$1
    shift
    if [ -n "$limit" ]; then
        timeout -s INT -k 60 "$limit" "$VENV/bin/mutmut" run --max-children "$jobs" "$@" \
            >>"$log" 2>&1 || status=$?
    else
        "$VENV/bin/mutmut" run --max-children "$jobs" "$@" >>"$log" 2>&1 || status=$?
    fi
}

# True when the last run was stopped by its time limit (124: timeout, 130: SIGINT, 137: killed).
stopped() { [ "$status" -eq 124 ] || [ "$status" -eq 130 ] || [ "$status" -eq 137 ]; }

started=$(date +%s)
status=0
if [ -n "${MUTATION_MODULE_TIME_LIMIT:-}" ]; then
    for module in $modules; do
        module_started=$(date +%s)
        status=0
        mutmut_run "$MUTATION_MODULE_TIME_LIMIT" "$module.*"
        if [ "$status" -ne 0 ] && ! stopped; then
            break
        fi
        note=""
        if [ "$status" -ne 0 ]; then note=" (stopped at the limit)"; fi
        echo "$module: $(( $(date +%s) - module_started ))s$note"
        status=0
    done
else
    mutmut_run "${MUTATION_TIME_LIMIT:-}"
fi
elapsed=$(( $(date +%s) - started ))
if [ ! -d mutants ] || { [ "$status" -ne 0 ] && ! stopped; }; then
    echo "mutmut run failed (exit $status); the end of its log ($log):" >&2
    tail -c 3000 "$log" | tr '\r' '\n' | grep -v '^\s*[⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏]' | tail -40 >&2
    exit 1
fi
if stopped; then
    echo "note: stopped after the ${MUTATION_TIME_LIMIT}s time limit; the rest is 'not checked'"
fi
if [ -n "${MUTATION_MODULE_TIME_LIMIT:-}" ]; then
    echo "note: each module had at most ${MUTATION_MODULE_TIME_LIMIT}s; what it did not reach is" \
         "counted under 'other' (not checked)"
fi

results="$(mktemp -t mutmut-results.XXXXXX)"
"$VENV/bin/mutmut" results --all true >"$results" 2>/dev/null
"$VENV/bin/python" - "$results" <<'EOF'
import sys
import tomllib
from collections import Counter, defaultdict

with open("pyproject.toml", "rb") as f:
    only_mutate = tomllib.load(f)["tool"]["mutmut"]["only_mutate"]
modules = [p.removesuffix(".py").replace("/", ".") for p in only_mutate]
by_module: dict[str, Counter] = defaultdict(Counter)
for line in open(sys.argv[1]):
    name, sep, status = line.strip().rpartition(": ")
    module = next((m for m in modules if name.startswith(m + ".")), None)
    if sep and module is not None:
        by_module[module][status] += 1


def row(label: str, c: Counter) -> None:
    total = sum(c.values()) - c["skipped"]
    caught = c["killed"] + c["timeout"]
    score = f"{caught}/{total} = {100 * caught / total:5.1f}%" if total else "no mutants"
    other = total - caught - c["survived"] - c["no tests"]
    print(f"{label:38} {score:>20}   survived {c['survived']:4}   no tests {c['no tests']:4}"
          f"   timeout {c['timeout']:3}   other {other:3}")


print(f"{'module':38} {'killed / total':>20}")
overall: Counter = Counter()
for module in modules:
    overall.update(by_module[module])
    row(module, by_module[module])
row("overall", overall)
EOF
rm -f "$results"
echo "mutmut run took ${elapsed}s with $jobs workers (log: $log)"
