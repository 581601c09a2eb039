#!/bin/bash
set -euo pipefail
# Round the page count up, and make page 1 start at index 0.
sed -i \
    -e 's|return total_items // per_page|return (total_items + per_page - 1) // per_page|' \
    -e 's|start = page \* per_page|start = (page - 1) * per_page|' \
    /app/paginate.py
grep -q '(page - 1) \* per_page' /app/paginate.py
grep -q '(total_items + per_page - 1) // per_page' /app/paginate.py
