#!/bin/bash
# Reward 1 only if /app/greeting.txt holds exactly the expected line plus a newline.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt

# Byte-exact comparison of two files (coreutils only).
same_bytes() { [ "$(sha256sum < "$1")" = "$(sha256sum < "$2")" ]; }

f=/app/greeting.txt
if [ -f "$f" ] && same_bytes "$f" <(printf 'Hello from the terminal!\n'); then
    echo "greeting.txt is correct"
    echo 1 > /logs/verifier/reward.txt
else
    echo "greeting.txt is missing or its content is wrong"
fi
