#!/bin/bash
set -euo pipefail
cd /app/project
git init -q .
git add -A
git -c user.name="Robin Example" -c user.email="robin@example.org" \
    commit -q -m "Initial import"
