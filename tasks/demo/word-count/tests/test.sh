#!/bin/bash
# Reward 1 only if /app/word_count.txt holds the correct word count of story.txt.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt

EXPECTED=92
f=/app/word_count.txt
if [ ! -f "$f" ]; then
    echo "missing $f"
    exit 0
fi

# Accept the number with or without one trailing newline, nothing else.
content=$(cat "$f")
if ! printf '%s' "$content" | grep -Eqx '[0-9]+'; then
    echo "word_count.txt must hold only digits, got: '$content'"
    exit 0
fi
if [ "$(wc -l < "$f")" -gt 1 ]; then
    echo "word_count.txt has extra lines"
    exit 0
fi
if [ "$content" -eq "$EXPECTED" ]; then
    echo "word count correct"
    echo 1 > /logs/verifier/reward.txt
else
    echo "expected $EXPECTED, got $content"
fi
