#!/bin/bash
set -euo pipefail
find /app/conf -type f -name '*.conf' \
    -exec sed -i 's/^log_level = debug$/log_level = info/' {} +
