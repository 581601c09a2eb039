#!/bin/bash
# Reward 1 only if /app/error_codes.txt lists exactly the unique ERROR codes, sorted.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt

# Byte-exact comparison of two files (coreutils only).
same_bytes() { [ "$(sha256sum < "$1")" = "$(sha256sum < "$2")" ]; }

f=/app/error_codes.txt
if [ ! -f "$f" ]; then
    echo "missing $f"
    exit 0
fi
if same_bytes "$f" <(printf 'E021\nE118\nE404\nE503\nE900\n'); then
    echo "error codes correct"
    echo 1 > /logs/verifier/reward.txt
else
    echo "unexpected content:"; cat "$f"
fi
