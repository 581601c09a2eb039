#!/bin/bash
set -euo pipefail
# Locate the "units" column from the header, then sum it.
awk -F, 'NR==1 { for (i = 1; i <= NF; i++) if ($i == "units") c = i; next }
         { s += $c } END { print s }' /app/orders.csv > /app/units_total.txt
