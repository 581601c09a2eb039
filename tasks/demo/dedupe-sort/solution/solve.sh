#!/bin/bash
set -euo pipefail
# Count with uniq -c, reformat to "<count> <city>", then order by count desc, city asc.
LC_ALL=C sort /app/visits.txt | uniq -c \
    | sed -E 's/^ *([0-9]+) /\1 /' \
    | LC_ALL=C sort -t ' ' -k1,1nr -k2 > /app/city_counts.txt
