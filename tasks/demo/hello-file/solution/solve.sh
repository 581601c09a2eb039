#!/bin/bash
set -euo pipefail
printf 'Hello from the terminal!\n' > /app/greeting.txt
