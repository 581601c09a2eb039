#!/bin/bash
# Partial credit: the share of the first 8 characters of /app/answer.txt that are the letter
# b (blue is the picture's colour, seen only in the picture). Only 8 bytes are ever read.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
f=/app/answer.txt
if [ ! -f "$f" ] || [ -L "$f" ]; then
    echo "no /app/answer.txt"
    exit 0
fi
hits=$(head -c 8 -- "$f" | tr -cd 'b' | wc -c)
awk -v hits="$hits" 'BEGIN { printf "%.3f\n", hits / 8 }' > /logs/verifier/reward.txt
echo "$hits of 8 characters are b"
