#!/bin/bash
# Reward 1 only if /app/city_counts.txt has the exact expected counts and order.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt

# Byte-exact comparison of two files (coreutils only).
same_bytes() { [ "$(sha256sum < "$1")" = "$(sha256sum < "$2")" ]; }

expected() {
    printf '%s\n' "4 berlin" "4 oslo" "3 kyoto" "2 lima" "2 new york" "1 accra" "1 lisbon"
}

f=/app/city_counts.txt
if [ ! -f "$f" ]; then
    echo "missing $f"
    exit 0
fi
if same_bytes "$f" <(expected); then
    echo "city counts correct"
    echo 1 > /logs/verifier/reward.txt
else
    echo "unexpected content:"; head -n 20 "$f"
fi
