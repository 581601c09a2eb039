#!/bin/bash
set -euo pipefail
wc -w < /app/story.txt | tr -d ' ' > /app/word_count.txt
