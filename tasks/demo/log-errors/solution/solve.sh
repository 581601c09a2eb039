#!/bin/bash
set -euo pipefail
# Field 2 is the level, field 4 the first word of the message.
awk '$2 == "ERROR" && $4 ~ /^E[0-9][0-9][0-9]$/ { print $4 }' /app/logs/service.log \
    | LC_ALL=C sort -u > /app/error_codes.txt
