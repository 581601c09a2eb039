#!/bin/bash
# Reward 1 only if /app/backup.tar.gz is a gzip tarball holding exactly the files of data/.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt

cd /tmp || exit 0
python3 - <<'PY'
import hashlib, sys, tarfile

# file name -> sha256 of the original content
EXPECTED = {
    "data/reports/2024/q1.txt": "a7f6358ccffc3b69d1c3b62220db5e08f7b31afc06c5d223f833cf9845118922",
    "data/reports/2024/q2.txt": "ffc8c0cc363e706d7445520c586a7fb56949df9aab9e8ca104a0e024dd21f6e2",
    "data/reports/README": "a362d00b36154e38591c1ca7758c7c39fa3f60590699b9f4641dc826483458f1",
    "data/settings.json": "255057097d7e0505c171b7415bf91ca8d3c6d2a15977834d0ded357b563488f7",
    "data/users.csv": "8057fe72235e6b8df44e5b70d3f8a8b78e5ceb4c362c53bdc0b0753f0467c462",
}

path = "/app/backup.tar.gz"
try:
    with open(path, "rb") as fh:
        if fh.read(2) != b"\x1f\x8b":
            sys.exit("backup.tar.gz is not gzip-compressed")
    found = {}
    with tarfile.open(path, "r:gz") as tar:
        for m in tar.getmembers():
            name = m.name[2:] if m.name.startswith("./") else m.name
            if m.isdir():
                if name.rstrip("/") != "data" and not name.startswith("data/"):
                    sys.exit("unexpected directory entry: " + m.name)
                continue
            if not m.isfile():
                sys.exit("unexpected non-regular member: " + m.name)
            found[name] = hashlib.sha256(tar.extractfile(m).read()).hexdigest()
except (OSError, tarfile.TarError, EOFError) as exc:
    sys.exit("cannot read archive: %s" % exc)

if found != EXPECTED:
    print("expected:", sorted(EXPECTED))
    print("found:   ", sorted(found))
    sys.exit("archive members or contents do not match")

# The source directory must still be there, unchanged.
for name, digest in EXPECTED.items():
    try:
        with open("/app/" + name, "rb") as fh:
            if hashlib.sha256(fh.read()).hexdigest() != digest:
                sys.exit("/app/%s was modified" % name)
    except OSError:
        sys.exit("/app/%s is missing" % name)
print("backup is correct")
PY
if [ $? -eq 0 ]; then
    echo 1 > /logs/verifier/reward.txt
fi
