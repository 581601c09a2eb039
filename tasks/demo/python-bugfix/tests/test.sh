#!/bin/bash
# Runs /tests/test_mathlib.py with unittest and writes /logs/verifier/reward.json:
#   tests_passed (fraction), tests_total, import_ok, and reward (1.0 only if every test passed).
mkdir -p /logs/verifier
echo '{"reward": 0.0, "tests_passed": 0.0}' > /logs/verifier/reward.json

cd /tests || exit 0
export PYTHONDONTWRITEBYTECODE=1
python3 - <<'PY'
import json
import sys
import unittest

result = {"reward": 0.0, "tests_passed": 0.0, "tests_total": 0, "import_ok": 0.0}
try:
    import test_mathlib  # also imports /app/mathlib.py
    result["import_ok"] = 1.0
    suite = unittest.defaultTestLoader.loadTestsFromModule(test_mathlib)
    total = suite.countTestCases()
    outcome = unittest.TextTestRunner(stream=sys.stdout, verbosity=2).run(suite)
    bad = len(outcome.failures) + len(outcome.errors)
    passed = total - bad
    result["tests_total"] = total
    result["tests_passed"] = round(passed / total, 4) if total else 0.0
    if total and bad == 0:
        result["reward"] = 1.0
except Exception as exc:  # e.g. mathlib.py missing or has a syntax error
    print("could not run tests:", exc)

print(result)
with open("/logs/verifier/reward.json", "w") as fh:
    json.dump(result, fh)
PY
