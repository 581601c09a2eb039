#!/bin/bash
set -euo pipefail
mkdir -p /app/extracted
tar -xzf /app/bundle.tar.gz -C /app/extracted
ini=$(find /app/extracted -type f -name release.ini | head -n 1)
python3 - "$ini" <<'PY'
import configparser, sys
cp = configparser.ConfigParser()
cp.read(sys.argv[1])
with open("/app/build_id.txt", "w") as fh:
    fh.write(cp["release"]["build_id"].strip() + "\n")
PY
