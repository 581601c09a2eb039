#!/bin/bash
set -euo pipefail
tar -czf /app/backup.tar.gz -C /app data
