#!/usr/bin/env bash
# Builds the local Docker base image that stands in for public base images (ubuntu:24.04,
# python:3.12-slim, ...) on machines that cannot pull from a registry. Cached by tag: a second
# run returns at once. Needs root, debootstrap and a running Docker engine. python3-pytest is in
# it because SWE-bench-format tasks built on it (the bundled swe-mini set) run their tests with
# pytest; a cached image made before that is rebuilt.
set -euo pipefail
tag="${1:-skyrl-agent/base:bookworm}"
if docker image inspect "$tag" >/dev/null 2>&1; then
  if docker run --rm --network none "$tag" python3 -c "import pytest" >/dev/null 2>&1; then
    echo "base image $tag: cached"
    exit 0
  fi
  echo "base image $tag: cached without pytest, rebuilding"
fi
# Use the Debian mirror this machine is already configured with.
mirror=$( { cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null || true; } \
  | awk '($1 == "URIs:" || $1 == "deb") && $2 ~ /^https?:/ && $2 !~ /security/ {print $2; exit}')
[ -n "$mirror" ] || { echo "error: no Debian mirror found in the apt sources" >&2; exit 2; }
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
echo "building base image $tag from $mirror (about a minute)"
debootstrap --variant=minbase \
  --include=python3,python3-pytest,tmux,ca-certificates,procps,git,bzip2,xz-utils,patch,less,curl \
  bookworm "$root" "$mirror" >/dev/null
# Trust the same extra CA files as the host, so HTTPS through an intercepting proxy works.
if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  chroot "$root" update-ca-certificates >/dev/null 2>&1 || true
fi
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | docker import --change 'CMD ["/bin/bash"]' --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "$tag" >/dev/null
echo "base image $tag: built"
