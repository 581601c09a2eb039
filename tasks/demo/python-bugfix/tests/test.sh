#!/bin/bash
# judge.py replaces this shell. It runs the agent's /app/mathlib.py only in an unprivileged
# child (probe.py), compares its answers on the hidden cases (cases.py) with the reference
# solution's, and writes /logs/verifier/reward.json: reward (1.0 only if every case is right),
# tests_passed (fraction), import_ok, isolated.
export PYTHONDONTWRITEBYTECODE=1
exec python3 /tests/judge.py
