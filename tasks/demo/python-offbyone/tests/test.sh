#!/bin/bash
# Reward 1 only if every pagination check passes.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt

if [ ! -f /app/paginate.py ]; then
    echo "missing /app/paginate.py"
    exit 0
fi

cd /tmp || exit 0
# Success is signalled by a marker line, not just the exit status, so that code
# in paginate.py that exits early on import cannot pass by accident.
out=$(PYTHONDONTWRITEBYTECODE=1 python3 - 2>&1 <<'PY'
import sys
sys.path.insert(0, "/app")
from paginate import page_count, get_page

items = list(range(1, 8))           # [1..7]
letters = list("abcdefghij")        # 10 items
checks = [
    (page_count(7, 3), 3),
    (page_count(6, 3), 2),
    (page_count(0, 3), 0),
    (page_count(1, 1), 1),
    (page_count(10, 4), 3),
    (get_page(items, 1, 3), [1, 2, 3]),
    (get_page(items, 2, 3), [4, 5, 6]),
    (get_page(items, 3, 3), [7]),
    (get_page(items, 4, 3), []),
    (get_page(letters, 1, 10), letters),
    (get_page(letters, 5, 2), ["i", "j"]),
    (get_page([], 1, 5), []),
]
failed = [i for i, (got, want) in enumerate(checks) if got != want]

for bad_call in (lambda: get_page(items, 0, 3), lambda: get_page(items, 1, 0),
                 lambda: page_count(5, 0)):
    try:
        bad_call()
        failed.append("no ValueError")
    except ValueError:
        pass

# Every item must appear exactly once across all pages.
for n in range(0, 12):
    for per in range(1, 5):
        data = list(range(n))
        pages = [get_page(data, p, per) for p in range(1, page_count(n, per) + 1)]
        if sum(pages, []) != data or any(not pg for pg in pages):
            failed.append(("cover", n, per))

if failed:
    print("failed checks:", failed)
    sys.exit(1)
print("ALL PAGINATION CHECKS PASSED")
PY
)
echo "$out"
if [ "$(printf '%s\n' "$out" | tail -n 1)" = "ALL PAGINATION CHECKS PASSED" ]; then
    echo 1 > /logs/verifier/reward.txt
fi
