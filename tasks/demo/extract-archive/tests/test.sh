#!/bin/bash
# Reward 1 only if the bundle was extracted to /app/extracted and build_id.txt is correct.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt

# Byte-exact comparison of two files (coreutils only).
same_bytes() { [ "$(sha256sum < "$1")" = "$(sha256sum < "$2")" ]; }

ok=1
for f in bundle/README.txt bundle/bin/run.sh bundle/meta/release.ini bundle/meta/checksums.txt; do
    if [ ! -f "/app/extracted/$f" ]; then
        echo "not extracted: /app/extracted/$f"
        ok=0
    fi
done
if [ "$ok" = 1 ] && ! grep -qx 'build_id = kq7-2219-fx' /app/extracted/bundle/meta/release.ini; then
    echo "extracted release.ini has unexpected content"
    ok=0
fi
if [ ! -f /app/bundle.tar.gz ]; then
    echo "/app/bundle.tar.gz was removed"
    ok=0
fi

f=/app/build_id.txt
if [ ! -f "$f" ]; then
    echo "missing $f"
    ok=0
elif ! { same_bytes "$f" <(printf 'kq7-2219-fx\n') || same_bytes "$f" <(printf 'kq7-2219-fx'); }; then
    echo "wrong build id: '$(head -c 100 "$f")'"
    ok=0
fi

if [ "$ok" = 1 ]; then
    echo "all checks passed"
    echo 1 > /logs/verifier/reward.txt
fi
